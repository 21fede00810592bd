"""Render collapsed stacks as a static flame graph SVG (root at the bottom, width = samples).

py-spy writes one format per recording; rather than sampling the child twice we record
speedscope JSON (interactive, opens in speedscope.app) and draw the SVG from the same samples.
Frames are coloured by where they live so the engine's share stands out: our `engine/` in blue,
`torch/` in orange, native code in grey, everything else in warm reds.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape

ROW_PX = 17
WIDTH_PX = 1200
MARGIN_PX = 10
HEADER_PX = 48
CHAR_PX = 7.0          # average glyph width of 11px monospace, for truncating labels
MIN_WIDTH_PX = 0.3     # narrower frames are dropped: invisible, and they bloat the file


@dataclass
class _Node:
    name: str
    count: int = 0
    children: dict[str, "_Node"] = field(default_factory=dict)


def build_tree(stacks: Counter[tuple[str, ...]]) -> _Node:
    root = _Node("all")
    for stack, count in stacks.items():
        node = root
        node.count += count
        for name in stack:
            node = node.children.setdefault(name, _Node(name))
            node.count += count
    return root


def _depth(node: _Node) -> int:
    return 1 + max((_depth(c) for c in node.children.values()), default=0)


def frame_colour(label: str) -> str:
    """A stable colour per frame, hue by origin (engine / torch / native / other)."""
    digest = int(hashlib.md5(label.encode()).hexdigest()[:6], 16)
    jitter = digest % 40
    if label == "all":
        return "rgb(200,200,200)"
    _, _, where = label.partition(" (")
    if not where or ".so" in where or label.startswith("0x"):
        return f"rgb({170 + jitter // 2},{170 + jitter // 2},{170 + jitter // 2})"
    if "engine/" in where:
        return f"rgb({80 + jitter // 2},{140 + jitter},{220})"
    if "torch/" in where:
        return f"rgb(240,{150 + jitter},{60 + jitter // 2})"
    return f"rgb(230,{80 + jitter * 2},{60 + jitter})"


def render_svg(stacks: Counter[tuple[str, ...]], title: str) -> str:
    root = build_tree(stacks)
    if root.count == 0:
        raise ValueError("render_svg: no samples to draw")
    depth = _depth(root)
    height = HEADER_PX + depth * ROW_PX + MARGIN_PX
    scale = (WIDTH_PX - 2 * MARGIN_PX) / root.count
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH_PX}" height="{height}" '
        f'viewBox="0 0 {WIDTH_PX} {height}" font-family="monospace" font-size="11">',
        f'<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{WIDTH_PX / 2}" y="20" text-anchor="middle" font-size="15">{escape(title)}</text>',
        f'<text x="{MARGIN_PX}" y="38" fill="#555">{root.count} samples; hover a frame for its share. '
        'blue: engine/, orange: torch/, grey: native</text>',
    ]

    def draw(node: _Node, x: float, level: int) -> None:
        w = node.count * scale
        if w < MIN_WIDTH_PX:
            return
        y = height - MARGIN_PX - (level + 1) * ROW_PX
        share = 100.0 * node.count / root.count
        tip = escape(f"{node.name}: {node.count} samples ({share:.1f}%)")
        parts.append(f'<g><title>{tip}</title><rect x="{x:.2f}" y="{y}" width="{w:.2f}" '
                     f'height="{ROW_PX - 1}" fill="{frame_colour(node.name)}" rx="2"/>')
        fit = int((w - 6) / CHAR_PX)
        if fit >= 3:
            text = node.name if len(node.name) <= fit else node.name[: fit - 2] + ".."
            parts.append(f'<text x="{x + 3:.2f}" y="{y + ROW_PX - 5}">{escape(text)}</text>')
        parts.append("</g>")
        child_x = x
        for child in sorted(node.children.values(), key=lambda c: c.name):
            draw(child, child_x, level + 1)
            child_x += child.count * scale

    draw(root, MARGIN_PX, 0)
    parts.append("</svg>")
    return "\n".join(parts)


def write_svg(stacks: Counter[tuple[str, ...]], path: Path, title: str) -> Path:
    path = Path(path)
    path.write_text(render_svg(stacks, title))
    return path
