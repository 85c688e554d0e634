"""What every command runs on: one-line errors, atomic files and checked outputs, locks, clean
stops and child processes, and the Apache Beam runners."""
