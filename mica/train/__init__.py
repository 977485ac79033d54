"""`mica train`: nanoGPT's configuration, the compiled programs, and the native trainer."""
