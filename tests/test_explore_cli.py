"""`vitkit explore` as a user runs it: a real process, the printed address, a busy port."""

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

import vitkit
from vitkit.cli import main


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("explore") / "vit.safetensors"
    vitkit.save_model(vitkit.create_model("vit_nano_patch4_32", num_classes=3), path)
    return path


def test_the_command_serves_the_page_at_the_printed_address(checkpoint, tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "vitkit", "explore", "--checkpoint", str(checkpoint), "--port",
         "0", "--images", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if line.startswith("open http://127.0.0.1:"):
                break
            assert proc.poll() is None, "".join(lines) + proc.stderr.read()
        url = lines[-1].split()[1]
        assert "?token=" in url and len(url.split("token=")[1]) >= 32
        with urllib.request.urlopen(url, timeout=30) as r:  # the page itself
            assert r.status == 200 and b"vitkit explore" in r.read()
        base, token = url.split("/?token=")
        with urllib.request.urlopen(f"{base}/api/model?token={token}", timeout=30) as r:
            assert b'"depth":4' in r.read()  # vit_nano_patch4_32
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}/api/model", timeout=30)
        assert refused.value.code == 403
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_busy_port_is_a_message(checkpoint, capsys):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        code = main(["explore", "--checkpoint", str(checkpoint), "--port",
                     str(busy.getsockname()[1])])
    finally:
        busy.close()
    err = capsys.readouterr().err
    assert code == 2 and "cannot listen on 127.0.0.1" in err and "--port 0" in err


def test_a_comparison_checkpoint_of_another_architecture_is_a_message(checkpoint, tmp_path,
                                                                      capsys):
    other = tmp_path / "micro.safetensors"
    vitkit.save_model(vitkit.create_model("vit_micro_patch4_32", num_classes=3), other)
    code = main(["explore", "--checkpoint", str(checkpoint), "--compare-checkpoint", str(other),
                 "--port", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "same architecture" in err and "depth" in err


def test_an_audit_folder_that_is_not_one_is_a_message(checkpoint, tmp_path, capsys):
    code = main(["explore", "--audit", str(tmp_path), "--port", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "is not a finished audit folder" in err


def test_an_audit_of_a_bare_state_dict_is_explored_with_its_model(tmp_path, capsys):
    """`vitkit audit --model NAME` records the name, so `vitkit explore --audit DIR` loads the
    bare state dict the audit read without being told again (it gets as far as the port)."""
    import json

    import timm
    import torch

    bare = tmp_path / "dinov3_s16.pth"
    torch.save(timm.create_model("vit_small_patch16_dinov3", pretrained=False).state_dict(), bare)
    folder = tmp_path / "audit"
    folder.mkdir()
    record = {"images": [], "clusters": [], "findings": [], "hypotheses": [],
              "options": {"checkpoint": str(bare), "model": "vit_small_patch16_dinov3"}}
    (folder / "audit.json").write_text(json.dumps(record))
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        code = main(["explore", "--audit", str(folder), "--port", str(busy.getsockname()[1])])
        err = capsys.readouterr().err
        assert code == 2 and "cannot listen on 127.0.0.1" in err, err  # loaded, by its name
        record["options"]["model"] = None  # an audit of a file that needs no name
        (folder / "audit.json").write_text(json.dumps(record))
        assert main(["explore", "--audit", str(folder), "--port", "0"]) == 2
        assert "rotary" in capsys.readouterr().err  # the bare file cannot say its embeddings
    finally:
        busy.close()


def test_an_audit_json_without_its_findings_is_a_message(tmp_path, capsys):
    import json

    (tmp_path / "audit.json").write_text(json.dumps(
        {"images": [], "clusters": [], "options": {"checkpoint": "x.safetensors"}}))
    code = main(["explore", "--audit", str(tmp_path), "--port", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "is not a finished audit folder ('findings')" in err, err
