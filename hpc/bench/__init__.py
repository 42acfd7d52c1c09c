"""Sizing a deployment by measuring it: `hpc-serve bench` (an asyncio load generator: workloads, arrivals,
streaming TTFT/ITL, summaries, plots) and `hpc-serve metrics` (every replica's Prometheus page, summed, and
live rates). One module per concern: workloads, arrivals, loadgen, stats, report, plots, run (bench), cli;
replica_metrics and metrics_view (metrics).
"""
