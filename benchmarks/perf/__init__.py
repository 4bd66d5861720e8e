"""What lvfl costs: throughput, latency, memory and bytes, of training, set-up, the transport, PSI, OT and serving."""
