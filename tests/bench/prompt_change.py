"""prompt_change.py - a text encoder offloaded to host memory between prompts.

WebUIs short on GPU memory keep the text encoder on the CPU while the UNet
runs and move it back to the GPU for the next prompt (a 1.3 GB fp16 encoder
for SDXL).  On the host that is: allocate the encoder's tensors and fill
them (the device-to-host copy), hold them while the GPU generates, free
them when they go back to the GPU, and the next prompt does it again.  The
host sits still while the GPU works: an allocator that returns the freed
gigabytes when the process looks idle pays for it in page faults on every
prompt; one that never returns them holds them while nothing uses them.

This builds the host side without a GPU: each prompt allocates and fills the
encoder's tensors (timed: "offload"), sleeps --hold seconds, frees them and
sleeps --gap seconds (the generation), and records RssAnon during the gap.
With --loaded MB, the process first builds that much model on the host and
frees it (moved to the GPU), as a WebUI does before its first prompt: the
first gap then holds the leftover and the encoder's memory together.

usage: prompt_change.py --encoder MB --prompts N --gap S [--hold S] [--loaded MB]
Prints one JSON object: offload_ms (median over prompts after the first; offload_ms_mean their mean,
which counts the prompts an allocator made slow while it learnt; offload_ms_later the median from the third
prompt on, once an allocator that learns from the second had the chance),
offload_ms_first, offload_faults_each (the page faults of each prompt's offload, minor and major: memory the
allocator had to have the kernel fill again; offload_faults_later their median from the third prompt),
anon_gap_max / anon_gap_median (RssAnon late in each gap, bytes) and rss_baseline.
"""

import argparse
import json
import os
import resource
import statistics
import time

import torch

from model_switch import rss_anon_bytes

MIB = 1 << 20
HIDDEN, MLP = 1280, 5120  # an OpenCLIP-bigG-sized transformer layer
LAYER = (
    (3 * HIDDEN, HIDDEN),  # q, k, v projection
    (3 * HIDDEN,),
    (HIDDEN, HIDDEN),  # attention output
    (HIDDEN,),
    (HIDDEN,),  # layer norms
    (HIDDEN,),
    (MLP, HIDDEN),  # MLP in
    (MLP,),
    (HIDDEN, MLP),  # MLP out
    (HIDDEN,),
)
EMBEDDING = (49408, HIDDEN)


def encoder_shapes(target_bytes):
    shapes, total = [EMBEDDING], EMBEDDING[0] * EMBEDDING[1] * 2
    while total < target_bytes:
        for shape in LAYER:
            shapes.append(shape)
            n = 1
            for d in shape:
                n *= d
            total += n * 2
    return shapes


def page_faults():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt + usage.ru_majflt


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoder", type=int, required=True, help="encoder size in MiB (fp16)")
    parser.add_argument("--prompts", type=int, required=True, help="prompt changes")
    parser.add_argument("--gap", type=float, required=True, help="seconds the host sits still per prompt")
    parser.add_argument("--hold", type=float, default=0.2, help="seconds the encoder stays on the host")
    parser.add_argument("--loaded", type=int, default=0, help="MiB of model built on the host and freed first")
    args = parser.parse_args()
    torch.set_num_threads(1)
    shapes = encoder_shapes(args.encoder * MIB)

    baseline = rss_anon_bytes()
    if args.loaded:
        model = [torch.empty(shape, dtype=torch.float16).fill_(1) for shape in encoder_shapes(args.loaded * MIB)]
        del model
    offload, faults, gap_anon = [], [], []
    for prompt in range(args.prompts):
        before = page_faults()
        start = time.monotonic()
        encoder = [torch.empty(shape, dtype=torch.float16).fill_(prompt + 1) for shape in shapes]
        offload.append(time.monotonic() - start)
        faults.append(page_faults() - before)
        time.sleep(args.hold)
        del encoder
        time.sleep(args.gap * 0.9)
        gap_anon.append(rss_anon_bytes())
        time.sleep(args.gap * 0.1)

    later = offload[1:] or offload
    print(
        json.dumps(
            {
                "ops": args.prompts,
                "rss_baseline": baseline,
                "offload_ms": round(statistics.median(later) * 1000, 2),
                "offload_ms_mean": round(statistics.mean(later) * 1000, 2),
                "offload_ms_first": round(offload[0] * 1000, 2),
                "offload_ms_later": round(statistics.median(offload[2:] or later) * 1000, 2),
                "offload_ms_each": [round(x * 1000, 2) for x in offload],
                "offload_faults_each": faults,
                "offload_faults_later": int(statistics.median(faults[2:] or faults[1:] or faults)),
                "anon_gap_max": max(gap_anon),
                "anon_gap_median": int(statistics.median(gap_anon)),
            }
        )
    )


if __name__ == "__main__":
    main()
