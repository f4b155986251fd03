// Fuzz test: being written.
