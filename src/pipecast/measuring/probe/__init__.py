"""The probe: links, collectives, matmul rate, memory and host costs of this machine."""
