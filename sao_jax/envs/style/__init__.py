"""Style-judged online learning: the environment and rule judge (`env`), and the
optional HTTP judge (`judge`)."""
