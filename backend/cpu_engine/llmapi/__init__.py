"""The CPU engine on the llmapi workflow: its leader node (MPI rank 0, reached by the `tensorrt_llm` model over the
spawn-proxy IPC address) and worker nodes (MPI ranks > 0), in TensorRT-LLM's process layout
(launcher/contracts/llmapi.py); the wire between the model and the leader node is protocol.py."""
