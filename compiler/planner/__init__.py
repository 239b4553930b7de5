"""Memory planning: KV region, then activation lifetimes -> events -> offsets, then a Layout."""
