"""Stand-ins of `tensorrt_llm.llmapi.mgmn_leader_node` / `mgmn_worker_node` (see the package's docstring)."""
