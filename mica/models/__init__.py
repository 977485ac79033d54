"""Models written with Mica's verbs: nanoGPT's GPT (`gpt`) and the tutorial's two-block model."""
