"""C code generation: emit.py turns one IR node into one C statement; render.py fills model.c.j2."""
