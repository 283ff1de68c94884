"""The profile report's screenshots in the docs (docs/images/report-900.png, report-1600.png):
a 4-stage pipelined MLP on one CPU (``profile_report_demo.FourStages``), host calls 0-3
recorded (call 0 is the warm-up the report leaves out), rendered in headless Chromium 900 and
1600 px wide, each as tall as the page.

    python scripts/report_screenshots.py [OUT_DIR] [IMAGES_DIR]

Exits 1 if the page scrolls sideways at a width or logs console messages.
"""
import os
import struct
import sys
import zlib

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from headless_chromium import page_metrics, screenshot  # noqa: E402

WIDTHS = (900, 1600)


def record(out):
    from profile_report_demo import FourStages

    import poptorch
    from openpop.runtime.trace import TraceSession
    torch.manual_seed(0)
    opts = poptorch.Options().deviceIterations(2)
    opts.Training.gradientAccumulation(8)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    opts.showCompilationProgressBar(False)
    model = FourStages(width=256)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    x, y = torch.randn(2 * 8 * 16, 256), torch.randn(2 * 8 * 16, 256)
    with TraceSession(out, calls=range(4)):
        for _ in range(4):
            training(x, y)
    training.destroy()
    return os.path.join(out, "report.html")


def read_png(path):
    """An 8-bit RGB(A), non-interlaced PNG (what Chromium writes) as an (h, w, 3) uint8 array."""
    import numpy as np
    with open(path, "rb") as stream:
        data = stream.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 4 if colour == 6 else 3
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    out = np.zeros((height, stride), dtype=np.uint8)
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind = raw[start]
        line = bytearray(raw[start + 1:start + 1 + stride])
        if kind == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif kind == 2:
            line = bytearray((np.frombuffer(line, np.uint8) + np.frombuffer(bytes(prev), np.uint8)).tobytes())
        elif kind == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 255
        elif kind == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b = prev[i]
                c = prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out[y] = np.frombuffer(bytes(line), np.uint8)
        prev = line
    return out.reshape(height, width, bpp)[:, :, :3]


def write_indexed(path, img, limit=256):
    """``img`` as a palette PNG: its ``limit`` most frequent colours, every other pixel the nearest
    of them (a report is mostly white, greys and a few chart colours: 2-3 times smaller)."""
    import numpy as np
    h, w, _ = img.shape
    packed = (img[..., 0].astype(np.int64) << 16) | (img[..., 1].astype(np.int64) << 8) | img[..., 2]
    colours, inverse, counts = np.unique(packed.ravel(), return_inverse=True, return_counts=True)
    rgb = np.stack([(colours >> 16) & 255, (colours >> 8) & 255, colours & 255], axis=1)
    keep = np.argsort(-counts)[:limit]
    palette = rgb[keep]
    distance = ((rgb[:, None, :] - palette[None, :, :]) ** 2).sum(axis=2)
    nearest = distance.argmin(axis=1)
    index = nearest[inverse].reshape(h, w).astype(np.uint8)
    raw = b"".join(b"\x00" + index[y].tobytes() for y in range(h))

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xffffffff)

    data = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 3, 0, 0, 0))
            + chunk(b"PLTE", palette.astype(np.uint8).tobytes()) + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b""))
    with open(path, "wb") as stream:
        stream.write(data)


def shrink_png(path) -> None:
    """Rewrite a screenshot as a palette PNG (numpy; left as it is without numpy)."""
    try:
        write_indexed(path, read_png(path))
    except ImportError:
        pass


def shoot(page, images, widths=WIDTHS):
    """A screenshot per width, as tall as the page there; returns the problems found."""
    os.makedirs(images, exist_ok=True)
    problems = []
    for width in widths:
        metrics = page_metrics(page, width)
        if metrics["scrollWidth"] > metrics["clientWidth"]:
            problems.append(f"{width} px: the page scrolls sideways ({metrics['scrollWidth']} px wide)")
        if metrics["boxesScrolling"]:
            problems.append(f"{width} px: {metrics['boxesScrolling']} tables scroll sideways in their boxes")
        png = os.path.join(images, f"report-{width}.png")
        messages = screenshot(page, png, width, metrics["scrollHeight"])
        problems += [f"{width} px: console: {m}" for m in messages]
        shrink_png(png)
        print(f"{os.path.normpath(png)}: {width} x {metrics['scrollHeight']} px, {os.path.getsize(png) // 1024} KiB")
    return problems


def main(argv):
    out = argv[0] if argv else "report_screenshots"
    images = argv[1] if len(argv) > 1 else os.path.join(HERE, "..", "docs", "images")
    problems = shoot(record(out), images)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
