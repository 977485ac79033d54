"""Token data: nanoGPT's raw .bin files and the speedrun's shards, and preparing them from text."""
