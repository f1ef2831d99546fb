#!/usr/bin/python3
"""Turns a benchmark script's raw outputs (tandem bench JSON reports, tool logs) into its
section (<section>.md) and a summary (<section>.json) in OUTDIR (docs/benchmarks by default).

  render.py decode_bandwidth|batching|disagg|serve_curve|gpu_serve|gpu_disagg|gpu_peer|peer|
            peer_<name> (peer.sh's PEER_SECTION, e.g. peer_moe) WORK OUTDIR

WORK holds machine.txt, tandem.txt, commands.txt (label<TAB>command lines) and the raw files
the section's script wrote. Medians are over the repetitions; ratios are medians of
per-repetition ratios of runs made side by side (interleaved), so that background load hits
both sides alike.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    command = argv[1]
    if command == "decode_bandwidth":
        from render_decode import render_decode_bandwidth
        render_decode_bandwidth(argv[2], argv[3])
    elif command == "batching":
        from render_batching import render_batching
        render_batching(argv[2], argv[3])
    elif command == "disagg":
        from render_disagg import render_disagg
        render_disagg(argv[2], argv[3])
    elif command == "serve_curve":
        from render_serve_curve import render_serve_curve
        render_serve_curve(argv[2], argv[3])
    elif command == "gpu_serve":
        from render_gpu_serve import render_gpu_serve
        render_gpu_serve(argv[2], argv[3])
    elif command == "gpu_disagg":
        from render_gpu_disagg import render_gpu_disagg
        render_gpu_disagg(argv[2], argv[3])
    elif command == "gpu_peer":
        from render_gpu_peer import render_gpu_peer
        render_gpu_peer(argv[2], argv[3])
    elif command == "peer" or command.startswith("peer_"):  # peer.sh's PEER_SECTION names
        from render_peer import render_peer
        render_peer(argv[2], argv[3], command)
    else:
        sys.exit(f"unknown command {command}\n{__doc__}")


if __name__ == "__main__":
    main(sys.argv)
