//! The /ui page's safety over plain HTTP (no browser): cross-site POSTs and foreign `Host`s
//! refused, a remote caller's admin-key login and session, no prompt text in the activity feed.
