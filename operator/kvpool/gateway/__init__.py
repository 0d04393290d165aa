"""The admission gateway: an OpenAI-compatible proxy enforcing the compiled admission config."""
