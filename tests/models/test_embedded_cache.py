"""The embedded model's cache shared by processes: two that build the same entry at once (two runs,
or the test suite's two workers, on one cache) both load a whole model, and the cache keeps one."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
# Builds the entry at argv[1] through load_embedded; both processes reach the cache's writes (the
# tokenizer folder's, then the model folder's) together: each waits there until the other arrives.
BUILD = """
import sys, time
from pathlib import Path
import agentrl.models.embedded as embedded
from agentrl.config import TinyModelConfig
from agentrl.models.tiny import build_model, build_tokenizer
path, me, other = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
def meet(name):
    Path(f"{me}.{name}").touch()
    while not Path(f"{other}.{name}").exists():
        time.sleep(0.005)
real_save, real_folder = embedded.save_pretrained, embedded.tokenizer_folder
def save_pretrained(model, tokenizer, dst):
    meet("model")
    return real_save(model, tokenizer, dst)
def build(tokenizer_dir):
    tokenizer = build_tokenizer(["user\\nP _ _ G\\nassistant\\n<answer>Left</answer>"] * 20, vocab_size=300)
    meet("tokenizer")
    real_folder(tokenizer, tokenizer_dir)
    return build_model(TinyModelConfig(hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                                       num_attention_heads=4, num_key_value_heads=2), tokenizer, seed=0), tokenizer
embedded.save_pretrained = save_pretrained
model, tokenizer = embedded.load_embedded(path, "float32", build, log=lambda m: None)
print(repr(sum(float(p.detach().double().sum()) for p in model.parameters())), tokenizer.name_or_path)
"""


def test_two_processes_building_one_cache_entry_at_once_both_load_it(tmp_path):
    entry = tmp_path / "cache" / "tiny-0123456789abcdef"
    entry.parent.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    procs = [subprocess.Popen([sys.executable, "-c", BUILD, str(entry), str(tmp_path / me), str(tmp_path / other)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for me, other in (("a", "b"), ("b", "a"))]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    assert outs[0][0] == outs[1][0] and outs[0][0].split()[1] == f"{entry}.tokenizer"  # the same model, whole
    assert sorted(p.name for p in entry.parent.iterdir()) == [entry.name, f"{entry.name}.tokenizer"]  # nothing staged left
