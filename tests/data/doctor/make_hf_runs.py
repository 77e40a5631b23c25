# ruff: noqa  (a one-off script kept as it was run: see README.md here)
"""Tiny offline Hugging Face Trainer runs for the doctor's catalogue (needs `accelerate`, which vitkit
does not depend on: install it in a scratch environment). Usage: make_hf_runs.py OUT LR WARMUP EPOCHS
(hf-healthy: 1e-3 0.1 8; hf-diverging: 50.0 0 8). Keeps trainer_state.json and config.json only."""
import os, sys, json, glob, shutil
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np, torch, transformers, accelerate
from transformers import Trainer, TrainingArguments, ViTConfig, ViTForImageClassification
torch.set_num_threads(1)
print("transformers", transformers.__version__, "torch", torch.__version__, "accelerate", accelerate.__version__)
OUT, LR, WR, EP = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
from sklearn.datasets import load_digits
d = load_digits()
x = d.images.astype(np.float32) / 16.0
x = np.kron(x, np.ones((2, 2), dtype=np.float32))
y = d.target.astype(np.int64)
x = ((x - 0.5) / 0.5)[:, None, :, :]
class DS(torch.utils.data.Dataset):
    def __init__(self, xs, ys):
        self.xs, self.ys = torch.from_numpy(np.ascontiguousarray(xs)), torch.from_numpy(ys)
    def __len__(self): return len(self.ys)
    def __getitem__(self, i): return {"pixel_values": self.xs[i], "labels": self.ys[i]}
train_ds, eval_ds = DS(x[:256], y[:256]), DS(x[256:320], y[256:320])
torch.manual_seed(0)
config = ViTConfig(image_size=16, patch_size=4, num_channels=1, hidden_size=32, num_hidden_layers=2,
    num_attention_heads=2, intermediate_size=64, num_labels=10,
    id2label={i: str(i) for i in range(10)}, label2id={str(i): i for i in range(10)})
model = ViTForImageClassification(config)
def compute_metrics(p):
    logits, labels = p
    return {"accuracy": float((np.argmax(logits, -1) == labels).mean())}
args = TrainingArguments(output_dir=OUT, num_train_epochs=EP, per_device_train_batch_size=32,
    per_device_eval_batch_size=64, learning_rate=LR, warmup_steps=WR, weight_decay=0.01,
    eval_strategy="epoch", save_strategy="epoch", logging_strategy="epoch", save_only_model=True,
    report_to=[], use_cpu=True, dataloader_num_workers=0, seed=0)
trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds, compute_metrics=compute_metrics)
result = trainer.train()
trainer.save_state()
trainer.save_model()
print("train metrics", result.metrics)
# prune to small text files
ckpts = sorted(glob.glob(os.path.join(OUT, "checkpoint-*")), key=lambda p: int(p.rsplit("-", 1)[1]))
keep_ck = ckpts[-1]
for c in ckpts[:-1]: shutil.rmtree(c)
for root in (OUT, keep_ck):
    for f in os.listdir(root):
        p = os.path.join(root, f)
        if p == keep_ck: continue
        if f not in ("trainer_state.json", "config.json"):
            print("rm", p); shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
for r, ds, fs in os.walk(OUT):
    for f in fs: print("kept", os.path.join(r, f))
