"""evt.explain(model, *example_inputs): what evt does with a model, as a report.

Compiles the model with backend="evt" (the given options), runs it once on the example inputs (and the backward of
its output's sum when it trains), and reports for the forward and the backward module: the evt segments and where
they run, every op left to PyTorch with the reason, and per segment the fused plan libevt would run
(evt_plan_report: groups by kind and path, kernel launches and bytes through global memory per step, against every
op as its own kernel). Report.html(path) writes the plan as an HTML page a browser opens: per segment its groups
as a table and the grouped graph as a picture (Graphviz `dot`; without it, the dot text to render).
"""
import collections
import ctypes
import html
import json
import re
import shutil
import subprocess

import torch

from . import backend as B
from . import config
from . import gpu as G
from . import lib as L
from . import placement as P
from .segment import Segment


def plan_report(text, options=None):
    """evt_plan_report of an optimized segment text (as the backend creates its programs: NO_OPT) as a dict."""
    fn = L._declare("evt_plan_report", ctypes.c_void_p, [ctypes.c_void_p, ctypes.POINTER(G.EvtOptions)])
    g = L.Graph(text, "<explain>")
    o = G.options_for(G.program_flags(options) | G.EVT_PROGRAM_FUSED, G.refine_level(options),
                      config.parse_options(options)["arch"], tf32=config.tf32(options))
    text = L.take_string(fn(g._g, ctypes.byref(o)))
    if text is None:
        raise L.EvtError(L.lib().evt_graph_error(g._g).decode())
    return json.loads(text)


class Report:
    """modules: [{"kind", "segments": [{"path", "ops", "plan" (plan_report, or None), "why"}], "fallbacks":
    [(op, node, reason)]}]; str() is the text report."""

    def __init__(self, modules):
        self.modules = modules

    def op_counts(self):
        """(ops in evt segments, ops run by PyTorch) over every module."""
        n_evt = sum(s["ops"] for m in self.modules for s in m["segments"] if s["path"] not in ("torch", "none"))
        return n_evt, sum(len(m["fallbacks"]) for m in self.modules)

    def fallback_reasons(self):
        """{ATen op: set of reasons} of every op left to PyTorch."""
        out = collections.defaultdict(set)
        for m in self.modules:
            for op, _, why in m["fallbacks"]:
                out[op].add(why)
        return dict(out)

    def totals(self):
        """Launches and bytes per step of evt's plans against every op as its own kernel, groups by kind/path."""
        t = collections.Counter()
        kinds = collections.Counter()
        for m in self.modules:
            for s in m["segments"]:
                plan = s["plan"]
                if not plan:
                    continue
                for k in ("kernels", "bytes", "unfused_kernels", "unfused_bytes"):
                    t[k] += max(plan[k], 0)
                for grp in plan["groups"]:
                    kinds[f'{grp["kind"]} ({grp["path"]})'] += 1
        return t, kinds

    def node_by_node_reasons(self):
        """Why groups run node by node, with counts (the reason's first clause, group numbers dropped)."""
        reasons = collections.Counter()
        for m in self.modules:
            for s in m["segments"]:
                for grp in (s["plan"] or {}).get("groups", []):
                    if grp["path"] == "node-by-node":
                        why = re.sub(r"^group \d+: ", "", grp["why"]).split(";")[0]
                        reasons[re.sub(r"^%\S+ \((\w+)\): ", r"\1: ", why)[:160]] += 1
        return reasons

    def __str__(self):
        lines = []
        for m in self.modules:
            segs = m["segments"]
            n_evt = sum(s["ops"] for s in segs if s["path"] not in ("torch", "none"))
            where = collections.Counter(s["path"] for s in segs)
            lines.append(f'{m["kind"]}: {n_evt} ops in evt ({", ".join(f"{v} segment(s) on {k}" for k, v in sorted(where.items())) or "no segment"}), '
                         f'{len(m["fallbacks"])} in PyTorch')
            for op, node, why in m["fallbacks"]:
                lines.append(f"  in PyTorch: {op} ({node}): {why}")
        t, kinds = self.totals()
        if t:
            lines.append(f'fused plan (what a GPU runs): {t["kernels"]} kernel launches and {t["bytes"] / 2**20:.2f} MiB '
                         f'through global memory per step; every op as its own kernel: {t["unfused_kernels"]} and '
                         f'{t["unfused_bytes"] / 2**20:.2f} MiB')
            lines.append("groups: " + ", ".join(f"{v} {k}" for k, v in kinds.most_common()))
            for why, n in self.node_by_node_reasons().most_common(8):
                lines.append(f"  {n} group(s) node by node: {why}")
        return "\n".join(lines)

    def html(self, path):
        """Writes the plan as one HTML page (a table of groups per segment, colored by kind); returns path."""
        color = {"gemm+evt": "#cfe8ff", "row": "#d9f5d0", "pointwise": "#fff2c2", "unfused": "#f8d0d0"}
        out = ["<!doctype html><meta charset=utf-8><title>evt plan</title>",
               "<style>body{font-family:sans-serif}td,th{padding:2px 8px;border-bottom:1px solid #ddd}</style>",
               f"<h1>evt plan</h1><pre>{html.escape(str(self))}</pre>"]
        for m in self.modules:
            for i, s in enumerate(m["segments"]):
                out.append(f'<h2>{html.escape(m["kind"])} segment {i} ({html.escape(s["path"])}, {s["ops"]} ops)</h2>')
                if not s["plan"]:
                    out.append(f'<p>{html.escape(s["why"] or "no fused plan")}</p>')
                    continue
                out.append("<table><tr><th>group</th><th>kind</th><th>path</th><th>ops</th><th>shape</th><th>why</th></tr>")
                for grp in s["plan"]["groups"]:
                    shape = "x".join(str(grp[d]) for d in "mnk" if grp[d])
                    out.append(f'<tr style="background:{color.get(grp["kind"], "#eee")}"><td>{grp["group"]}</td>'
                               f'<td>{grp["kind"]}</td><td>{grp["path"]}</td><td>{html.escape(grp["ops"])}</td>'
                               f'<td>{shape}</td><td>{html.escape(grp["why"])}</td></tr>')
                out.append("</table>")
                out.append(_picture(s["plan"].get("dot", "")))
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(out))
        return path


def _picture(dot_text):
    """The grouped graph as inline SVG when Graphviz's `dot` is installed, else its dot text to render."""
    if not dot_text:
        return ""
    if shutil.which("dot"):
        r = subprocess.run(["dot", "-Tsvg"], input=dot_text, capture_output=True, text=True)
        if r.returncode == 0 and "<svg" in r.stdout:
            return r.stdout[r.stdout.index("<svg"):]
    return ("<details><summary>fusion plan as Graphviz text (install graphviz to see it drawn: dot -Tsvg)</summary>"
            f"<pre>{html.escape(dot_text)}</pre></details>")


def _module_report(kind, plan, options):
    segs = []
    for s in plan.steps if plan is not None else []:
        if not isinstance(s, Segment):
            continue
        rep, why = None, getattr(s, "why", "") or ""
        if s.path in ("interp", "gpu") and getattr(s, "text", None):
            # (the optimized graph, as the backend creates its programs from it: the raw text under NO_OPT
            # would be planned without the passes)
            text = s.graph.text() if getattr(s, "graph", None) is not None else s.text
            try:
                rep = plan_report(text, options)
            except L.EvtError as e:
                why = f"no fused plan: {e}"
        segs.append({"path": s.path or "none", "ops": len(s.members), "plan": rep, "why": why})
    fallbacks = [(P.op_name(n), n.name, why) for n, why in (plan.fallbacks if plan is not None else [])]
    return {"kind": kind, "segments": segs, "fallbacks": fallbacks}


def report_backend(options=None):
    """(backend, report): evt's backend for these options (backend.make_backend, what backend="evt" runs) and the
    Report it fills as Dynamo compiles modules with it, e.g. through a training loop:
        backend, report = evt.report_backend()
        step = torch.compile(model, backend=backend)
        ...                   # train
        print(report)         # every module compiled so far"""
    opts = config.parse_options(options)
    report = Report([])

    def on_compiled(kind, run):
        report.modules.append(_module_report(kind, getattr(run, "plan", None), opts))

    def backend(gm, example_inputs):
        # (built per graph, as evt_backend does: cudagraphs "step" needs the Dynamo graph's input count)
        return B.make_backend(opts, len(example_inputs), on_compiled)(gm, example_inputs)
    return backend, report


def explain(model, *example_inputs, options=None, train=True):
    """Compiles model with backend="evt" and these options, runs it once on example_inputs (and, with train, the
    backward of its output's sum), and returns the Report of every module evt compiled (print it, or
    Report.html(path) for the picture)."""
    backend, report = report_backend(options)
    torch._dynamo.reset()
    out = torch.compile(model, backend=backend)(*example_inputs)
    if train:
        first = out if isinstance(out, torch.Tensor) else next(o for o in out if isinstance(o, torch.Tensor))
        if first.requires_grad:
            first.float().sum().backward()
    return report
