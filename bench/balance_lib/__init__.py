"""bench/balance: routing policies side by side on a fixed workload of agent sessions (issue 21)."""
