"""Stand-in of `python -m tensorrt_llm.llmapi.mgmn_worker_node` (every rank > 0 of an llmapi replica).

Upstream (NVIDIA/TensorRT-LLM@8f91cff2): `with MPICommExecutor(COMM_WORLD)`: a GPU worker that runs what the leader
node submits until the session ends, then logs "worker rank{N} quited". This stand-in opens its device as the
PyTorch worker does (standin.open_gpu), holds memory there, reports, and ends when the leader node has ended (a file
the leader touches stands in for the MPI session's end: the device machine runs no MPI job).
"""

from __future__ import annotations

import logging
import sys
import time

from tensorrt_llm.llmapi import standin


def main() -> int:
    info, _block = standin.open_gpu(standin.WORKER)
    standin.write_report(standin.report_path(standin.WORKER, info["global_rank"]), info)
    print(f"[standin] worker node rank {info['global_rank']}: device {info.get('device_index')}", flush=True)
    done = standin.leader_done_path()
    while not done.exists():
        time.sleep(0.2)
    logging.warning(f"worker rank{info['global_rank']} quited")
    return 0


if __name__ == "__main__":
    sys.exit(main())
