//! Plans for a prompt over a backend's context cap (to be written).
