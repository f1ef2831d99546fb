"""Helpers shared by the benchmark sections' renderers (see render.py)."""
import glob
import json
import os
import re
import statistics


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def spread(values):
    """'min-max' of the repetitions, for the noise column."""
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    return f"{fmt(min(values))}-{fmt(max(values))}"


def fmt(v, digits=3):
    if v is None:
        return "n/a"
    if isinstance(v, int):
        return str(v)
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.{digits}g}"


def pct(v):
    return "n/a" if v is None else f"{100 * v:.1f}%"


def load_reports(work, pattern):
    return [json.load(open(p)) for p in sorted(glob.glob(os.path.join(work, pattern)))]


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def commands_block(work, tandem):
    """The exact commands the script ran, with the build and work paths shortened."""
    lines, seen = [], set()
    for line in open(os.path.join(work, "commands.txt")):
        label, _, cmd = line.rstrip("\n").partition("\t")
        build_dir = os.path.dirname(os.path.dirname(tandem))
        cmd = cmd.replace(tandem, "tandem").replace(work + "/", "$WORK/")
        cmd = cmd.replace(build_dir + "/", "$BUILD_DIR/")
        cmd = re.sub(r"--seed \d+", "--seed $REP", cmd)
        cmd = re.sub(r"\.\d+\.json", ".$REP.json", cmd)
        cmd = re.sub(r"--port-file \S+", "--port-file F", cmd)
        cmd = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", cmd)
        if cmd in seen:
            continue
        seen.add(cmd)
        lines.append(f"# {label}\n{cmd}")
    return "```sh\n" + "\n".join(lines) + "\n```"


def header(work, script, title, reps):
    machine = open(os.path.join(work, "machine.txt")).read().strip()
    return (f"{title}\n\nProduced by `{script}` ({reps} repetitions, interleaved). Machine: "
            f"{machine}.\n")


def write(outdir, section, markdown, summary):
    os.makedirs(outdir, exist_ok=True)
    begin, end = f"<!-- BEGIN {section} -->", f"<!-- END {section} -->"
    with open(os.path.join(outdir, f"{section}.md"), "w") as f:
        f.write(f"{begin}\n{markdown.strip()}\n{end}\n")
    with open(os.path.join(outdir, f"{section}.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
