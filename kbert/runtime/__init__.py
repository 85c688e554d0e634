"""What every command runs on: one-line errors, atomic files and checked outputs, locks, clean
stops and child processes, the Apache Beam runners, and the names of mixed precision's 16-bit types."""
