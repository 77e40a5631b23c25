"""``vitkit explore --checkpoint C``: a local web page to look inside a ViT."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import secrets
import socket
from pathlib import Path

from vitkit.checkpoints import load_model
from vitkit.commands.options import add_model_option
from vitkit.errors import VitkitError
from vitkit.util.numbers import check_number, option
from vitkit.web.checks import same_architecture
from vitkit.web.samples import read_audit, sample_table
from vitkit.web.session import Explorer

for _module in ("fastapi", "uvicorn", "multipart"):  # the web extra; cheap to check, slow to import
    if importlib.util.find_spec(_module) is None:
        raise ImportError(f"{_module} is not installed", name=_module)

NAME = "explore"
HELP = "a local web page to look inside a ViT: every head, any patch, methods, causal tests"
DESCRIPTION = ("Loads a checkpoint (any layout load_model reads), starts a local server and "
               "prints the address to open: upload an image or pick a sample, see every head "
               "of every layer, where any patch looks, the attribution methods side by side, "
               "their faithfulness curves, per-head numbers, the logit lens and head "
               "importance. Binds to 127.0.0.1; the printed address carries a secret token.")
DEMO_CHECKPOINT = Path("runs/demo/vit/best.safetensors")
log = logging.getLogger("vitkit")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", default=None,
                   help=f"the model (default: the ViT `make demo` trained, {DEMO_CHECKPOINT})")
    add_model_option(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 "
                        "serves every interface, protected by the token alone)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any free)")
    p.add_argument("--images", default=None, help="a folder of images offered as samples")
    p.add_argument("--compare-checkpoint", default=None,
                   help="a second checkpoint of the same architecture (e.g. before fine-tuning), "
                        "shown beside the first in the compare panel")
    p.add_argument("--audit", default=None,
                   help="an audit folder (vitkit audit --out): its flags, ranked images and "
                        "clusters as samples; its checkpoint and --model unless given")
    p.add_argument("--max-upload-mb", type=float, default=20,
                   help="largest request body accepted, in MB (default 20)")
    p.add_argument("--max-megapixels", type=float, default=40,
                   help="largest image accepted, in megapixels (default 40)")
    p.add_argument("--cache-mb", type=int, default=512,
                   help="memory kept for images and results, in MB (default 512)")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: any free one), or a clear error."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise VitkitError(f"--host {host!r} is not an address of this machine ({err}); use "
                          "127.0.0.1") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit this: without it, a response's header and body writes wait
    # on the client's delayed ACK (about 40 ms per request on a kept-alive connection).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        raise VitkitError(f"cannot listen on {host}:{port} ({err.strerror}): another program "
                          "uses it, or the address is not this machine's; pass --port 0 for "
                          "any free port") from None
    sock.listen(128)
    return sock


def run(args: argparse.Namespace) -> None:
    import uvicorn

    from vitkit.web.app import create_app  # FastAPI: imported only when the page is served

    checkpoint, model_name = args.checkpoint, args.model_name
    if checkpoint is None and args.audit is not None:
        audited = read_audit(args.audit)["options"]
        checkpoint, model_name = audited["checkpoint"], model_name or audited.get("model")
    if checkpoint is None:
        if not DEMO_CHECKPOINT.exists():
            raise VitkitError(f"no --checkpoint given and no demo model at {DEMO_CHECKPOINT}: "
                              "run `make demo` (or `vitkit demo`) first, or pass --checkpoint "
                              "with any checkpoint vitkit reads")
        checkpoint = str(DEMO_CHECKPOINT)
    for name in ("max_upload_mb", "max_megapixels", "cache_mb"):
        check_number(option(name), getattr(args, name), positive=True, below=1e6,
                     error=VitkitError)
    if not 0 <= args.port <= 65535:
        raise VitkitError(f"--port must be 0..65535, got {args.port}")
    if args.images is not None and not Path(args.images).is_dir():
        raise VitkitError(f"--images {args.images} is not a folder; give a folder of images")
    model = load_model(checkpoint, model=model_name, verbose=False)
    explorer = Explorer(model, cache_mb=args.cache_mb,
                        max_pixels=int(args.max_megapixels * 1e6), name=Path(checkpoint).name)
    samples = sample_table(args.images, args.audit)
    compare = None
    if args.compare_checkpoint is not None:
        other = load_model(args.compare_checkpoint, model=args.model_name, verbose=False)
        same_architecture(model.cfg, other.cfg)
        compare = Explorer(other, cache_mb=args.cache_mb, name=Path(args.compare_checkpoint).name,
                           max_pixels=int(args.max_megapixels * 1e6))
    sock = bind(args.host, args.port)
    port = sock.getsockname()[1]  # the one bound (any free one for --port 0)
    token = secrets.token_urlsafe(24)
    app = create_app(explorer, token=token, host=args.host, port=port, samples=samples,
                     max_body=int(args.max_upload_mb * 2**20), compare=compare)
    shown = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
    shown = f"[{shown}]" if ":" in shown else shown
    print(f"vitkit explore: {explorer.name} ({explorer.depth} layers x {explorer.heads} heads, "
          f"{len(samples)} samples)", flush=True)
    print(f"open http://{shown}:{port}/?token={token}\nCtrl-C stops the server.", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    server.run(sockets=[sock])
