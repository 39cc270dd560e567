"""Pictures for TensorBoard: fonts that draw token labels (CJK when installed), viridis colours,
labelled heatmap grids. Nothing here knows a model or a task: the attention snapshot
(run/attention.py) and the classify task's confusion image both draw with it.
"""

from __future__ import annotations

import functools
import math
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

CJK_PROBE = "中文的"  # glyphs a font must draw to be used for Chinese token labels
# Where CJK fonts usually live when fontconfig is absent or does not know them.
CJK_FONT_PATHS = (
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/noto-cjk/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/google-noto-cjk/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
    "/usr/share/fonts/wqy-microhei/wqy-microhei.ttc",
    "/usr/share/fonts/wqy-zenhei/wqy-zenhei.ttc",
    "/usr/share/fonts/truetype/droid/DroidSansFallbackFull.ttf",
    "/usr/share/fonts/truetype/arphic/uming.ttc",
    "/System/Library/Fonts/PingFang.ttc",
    "/System/Library/Fonts/STHeiti Light.ttc",
    "/Library/Fonts/Arial Unicode.ttf",
    "C:/Windows/Fonts/msyh.ttc",
    "C:/Windows/Fonts/simhei.ttf",
)
# viridis at 9 evenly spaced points: dark = little attention, yellow = the head's maximum.
VIRIDIS = np.array([
    (68, 1, 84), (71, 44, 122), (59, 81, 139), (44, 113, 142), (33, 144, 141),
    (39, 173, 129), (92, 200, 99), (170, 220, 50), (253, 231, 37),
], np.float32)
MAX_LABEL_CHARS = 8


# --- fonts and labels ----------------------------------------------------------------------

def choose_labels(token_ids, vocab: Sequence[str] | None, font_file: str | None, size: int = 14,
                  font_index: int = 0) -> tuple[ImageFont.ImageFont, list[str]]:
    """The font and axis labels for tokens: their text in font_file when it draws CJK glyphs
    (a token it cannot draw falls back to "#id"), else the ids in DejaVu Sans or Pillow's
    built-in font."""
    ids = [int(i) for i in token_ids]
    if font_file and vocab is not None:
        try:
            font = ImageFont.truetype(font_file, size, index=font_index)
        except OSError:
            font = None
        if font is not None and has_glyphs(font, CJK_PROBE):
            return font, [_token_text(vocab[i], i, font) for i in ids]
    return plain_font(size), [str(i) for i in ids]


def plain_font(size: int) -> ImageFont.ImageFont:
    """DejaVu Sans (Pillow finds it in the system font folders) or Pillow's built-in font."""
    try:
        return ImageFont.truetype("DejaVuSans.ttf", size)
    except OSError:
        return ImageFont.load_default(size)


def _token_text(token: str, token_id: int, font) -> str:
    text = token if len(token) <= MAX_LABEL_CHARS else token[: MAX_LABEL_CHARS - 1] + "…"
    return text if has_glyphs(font, text) else f"#{token_id}"


def has_glyphs(font: ImageFont.FreeTypeFont, text: str) -> bool:
    """Whether font draws every character of text with a glyph of its own, not the empty box
    (.notdef) a font draws for characters it lacks."""
    missing = _render(font, chr(0x10FFFD))  # a private-use code point no font maps
    for char in set(text):
        drawn = _render(font, char)
        if drawn == missing or not any(drawn[1]):
            return False
    return True


def _render(font, text: str) -> tuple[tuple[int, int], bytes]:
    left, top, right, bottom = font.getbbox(text)
    canvas = Image.new("L", (max(right - left, 1) + 2, max(bottom - top, 1) + 2))
    ImageDraw.Draw(canvas).text((1 - left, 1 - top), text, font=font, fill=255)
    return canvas.size, canvas.tobytes()


@functools.lru_cache(maxsize=1)
def find_cjk_font() -> str | None:
    """An installed font file that draws Chinese: fontconfig's choice for Simplified Chinese,
    then any font it lists for Chinese, then the usual paths. None when there is none."""
    candidates = []
    if shutil.which("fc-match"):
        candidates += _fontconfig(["fc-match", "-f", "%{file}\n", "sans-serif:lang=zh-cn"])
    if shutil.which("fc-list"):
        candidates += _fontconfig(["fc-list", "-f", "%{file}\n", ":lang=zh"])
    candidates += list(CJK_FONT_PATHS)
    seen = set()
    for path in candidates:
        if path in seen or not Path(path).is_file():
            continue
        seen.add(path)
        try:
            if has_glyphs(ImageFont.truetype(path, 16), CJK_PROBE):
                return path
        except OSError:
            continue
    return None


def _fontconfig(command: list[str]) -> list[str]:
    try:
        listing = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return list(dict.fromkeys(line.strip() for line in listing.splitlines() if line.strip()))


# --- drawing ----------------------------------------------------------------------------------

def colorize(values: np.ndarray) -> np.ndarray:
    """Values in [0, 1] -> viridis RGB uint8 (..., 3)."""
    position = np.clip(values, 0.0, 1.0) * (len(VIRIDIS) - 1)
    low = np.minimum(np.floor(position).astype(int), len(VIRIDIS) - 2)
    frac = (position - low)[..., None]
    return np.round(VIRIDIS[low] * (1 - frac) + VIRIDIS[low + 1] * frac).astype(np.uint8)


def render_heatmaps(probs: np.ndarray, labels: list[str], font, title: str, cell: int = 16) -> np.ndarray:
    """probs (heads, T, T) -> one RGB image (H, W, 3) uint8: a grid of per-head heatmaps, each
    scaled to its own maximum, with the token labels down the left and across the top."""
    heads, length, _ = probs.shape
    text_font = plain_font(max(cell - 2, 11))
    label_width = max(int(np.ceil(font.getlength(label))) for label in labels) + 6
    line = _line_height(text_font)
    side = length * cell
    panel_w, panel_h = label_width + side + 16, line + label_width + side + 16
    columns = math.ceil(math.sqrt(heads))
    rows = math.ceil(heads / columns)
    canvas = Image.new("RGB", (max(columns * panel_w, int(text_font.getlength(title)) + 16), line + 8 + rows * panel_h),
                       "white")
    draw = ImageDraw.Draw(canvas)
    draw.text((8, 4), title, font=text_font, fill="black")
    for head in range(heads):
        x0 = (head % columns) * panel_w + 8
        y0 = line + 8 + (head // columns) * panel_h
        top = probs[head].max()
        draw.text((x0 + label_width, y0), f"head {head}  max {top:.2f}", font=text_font, fill="black")
        map_x, map_y = x0 + label_width, y0 + line + label_width
        pixels = colorize(probs[head] / max(float(top), 1e-9)).repeat(cell, 0).repeat(cell, 1)
        canvas.paste(Image.fromarray(pixels), (map_x, map_y))
        for index, label in enumerate(labels):
            middle = index * cell + cell // 2
            # queries down the left, right-aligned against the map
            draw.text((map_x - 3, map_y + middle), label, font=font, fill="black", anchor="rm")
            # keys across the top: upright when the label fits its column (one Chinese
            # character), else written bottom to top
            if font.getlength(label) <= cell:
                draw.text((map_x + middle, map_y - 3), label, font=font, fill="black", anchor="mb")
                continue
            mask = _vertical_text(label, font)
            canvas.paste("black", (map_x + middle - mask.width // 2, map_y - 3 - mask.height), mask)
    return np.asarray(canvas, np.uint8)


def _line_height(font) -> int:
    left, top, right, bottom = font.getbbox("Hg中")
    return bottom - min(top, 0) + 2


def _vertical_text(text: str, font) -> Image.Image:
    """A mask of text turned to read bottom to top (drawn through, so neighbours never clip)."""
    strip = Image.new("L", (int(np.ceil(font.getlength(text))) + 1, _line_height(font)), 0)
    ImageDraw.Draw(strip).text((0, 0), text, font=font, fill=255)
    return strip.rotate(90, expand=True)
