"""Model-repository templates: the five upstream models as Python tables (`tables.py`, `engine_tables.py`).

The tables are the single source of truth for tensor names, dtypes, dims, flags and parameter keys.
`backend/repository.py` renders them twice: filled (a deployable repository) and with upstream
`${key}` placeholders (the `<model>/config.pbtxt` files beside this module, kept for diffing against
upstream `fill_template.py` templates; `python -m backend.repository --write-templates` regenerates them
and a test checks they are in sync).
"""
