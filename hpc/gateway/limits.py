"""The gateway's bounds that its CLI, the spec's `gateway:` section and the app share, in a module without
imports, so that the CLI and spec validation can read them without loading the web stack."""

from __future__ import annotations

#: the default bound of a request's body, in MiB (`hpc-serve gateway --max-body-mb`, the spec's
#: `gateway.max_body_mb`; hpc/gateway/bodylimit.py): far above any prompt a model's context holds (a million
#: tokens are ~4 MB of text), far below what would strain the gateway's memory
MAX_BODY_MB = 16
