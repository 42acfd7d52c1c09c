"""The TensorRT-LLM release the stand-in behaves as (upstream's tensorrt_llm/version.py holds the release's string;
hpc-serve's launcher reads this file as it reads upstream's: launcher/node/llmapi.py VERSION_PROBE).

`HPC_SERVE_TRTLLM_STANDIN_VERSION` picks another supported release, so that tests run the launch against each
release's leader-node lifetime (launcher/contracts/trtllm_versions.py STOP_ACTION_SINCE).
"""

import os

from launcher.contracts.llmapi import STANDIN_DEFAULT_VERSION, STANDIN_VERSION_VAR

__version__ = os.environ.get(STANDIN_VERSION_VAR) or STANDIN_DEFAULT_VERSION
