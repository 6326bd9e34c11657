"""An EAGLE-3 head's acceptance computed offline, without vLLM: the trainer's metric and vLLM's, side by side.

    python -m benchmarks.eagle3_offline --head DIR [--target DIR] [--train-heldout N] [--prompts F ...]

The target (transformers, float32) answers each prompt greedily; its hidden states are read with the
same hooks as tuner.models.eagle3_data.extract (the residual stream entering each auxiliary layer, the
last layer's output before the final norm). A plain-torch copy of the head (vLLM's llama_eagle3
forward: input_norm, fc, one decoder layer over cat(norm(embed), hidden_norm(hidden)), final norm)
then drafts ``k`` tokens at every answer position, chained like vLLM (step i feeds the draft's own token
and its output hidden state, attending to the step-0 context and its own earlier steps). Reported per
position:

* ``full_acc_restricted``: speculators' validation metric (draft argmax == argmax of the target's logits
  restricted to the draft vocabulary, and all earlier positions right);
* ``full_acc``: vLLM's greedy acceptance (draft token == the target's real greedy token);
* ``coverage``: the share of answer tokens inside the draft vocabulary (a cap on acceptance).

``--responses FILE`` evaluates the training run's own sequences instead (a responses.jsonl of
tuner.models.eagle3_data.generate): the ``--sequences`` shortest, split like speculators' trainer
(``--train-ratio``): ``val`` is its validation split exactly, ``train`` the first ``--train-rows`` of the rest.
``--aux-shift`` reads the auxiliary states one layer later (-1: earlier) to test a layer-offset bug.
Writes JSON under benchmarks/results/<--out-dir>/.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.common import print_table, write_result_to
from benchmarks.eagle3_head import RESULTS, builder_prompt_sets, load_prompts


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


class Head:
    """vLLM's Eagle3LlamaForCausalLM forward (one layer), float32, from the exported checkpoint."""

    def __init__(self, head_dir: Path, embed: torch.Tensor):
        from safetensors.torch import load_file

        cfg = json.loads((head_dir / "config.json").read_text())
        tl = cfg["transformer_layer_config"]
        self.w = {
            k: v if k in ("d2t", "t2d") else v.float()
            for k, v in load_file(str(head_dir / "model.safetensors")).items()
        }
        self.cfg, self.eps = cfg, tl["rms_norm_eps"]
        self.heads, self.kv_heads, self.head_dim = tl["num_attention_heads"], tl["num_key_value_heads"], tl["head_dim"]
        self.theta = tl.get("rope_parameters", {}).get("rope_theta", tl.get("rope_theta", 10000.0))
        self.embed = embed
        self.d2t = self.w["d2t"]
        self.draft_to_target = torch.arange(len(self.d2t)) + self.d2t
        self.norm_output = cfg.get("norm_output", False)
        self.norm_before_residual = cfg.get("norm_before_residual", True)

    def fc(self, aux: torch.Tensor) -> torch.Tensor:
        if self.cfg.get("norm_before_fc"):
            aux = rms(aux, self.w["input_norm.weight"], self.eps)
        return aux @ self.w["fc.weight"].T

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # x [n, h, d], pos [n]
        half = self.head_dim // 2
        inv = 1.0 / (self.theta ** (torch.arange(0, half, dtype=torch.float32) / half))
        ang = pos.float()[:, None] * inv[None, :]
        cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
        x1, x2 = x[..., :half], x[..., half:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def qkv(self, tokens: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, ...]:
        p = "layers.0."
        e = rms(self.embed[tokens], self.w[p + "input_layernorm.weight"], self.eps)
        h = rms(hidden, self.w[p + "hidden_norm.weight"], self.eps)
        residual = h if self.norm_before_residual else hidden
        x = torch.cat([e, h], -1)
        n = x.shape[0]
        q = (x @ self.w[p + "self_attn.q_proj.weight"].T).view(n, self.heads, self.head_dim)
        k = (x @ self.w[p + "self_attn.k_proj.weight"].T).view(n, self.kv_heads, self.head_dim)
        v = (x @ self.w[p + "self_attn.v_proj.weight"].T).view(n, self.kv_heads, self.head_dim)
        return self.rope(q, pos), self.rope(k, pos), v, residual

    def finish(self, attn: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = "layers.0."
        h = attn.reshape(attn.shape[0], -1) @ self.w[p + "self_attn.o_proj.weight"].T + residual
        m = rms(h, self.w[p + "post_attention_layernorm.weight"], self.eps)
        m = F.silu(m @ self.w[p + "mlp.gate_proj.weight"].T) * (m @ self.w[p + "mlp.up_proj.weight"].T)
        h = h + m @ self.w[p + "mlp.down_proj.weight"].T
        normed = rms(h, self.w["norm.weight"], self.eps)
        logits = normed @ self.w["lm_head.weight"].T
        return logits, (normed if self.norm_output else h)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        rep = self.heads // self.kv_heads
        k, v = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)  # [m, h, d]
        scores = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~mask[None], float("-inf"))
        return torch.einsum("hnm,mhd->nhd", scores.softmax(-1), v)

    def draft(self, aux: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor:
        """Draft tokens (target ids) [n-1, k]: row t drafts tokens t+2.. from aux[t] and ids[t+1]."""
        n = ids.shape[0] - 1
        hidden, tokens, pos = self.fc(aux[:-1]), ids[1:], torch.arange(1, n + 1)
        q, k0, v0, res = self.qkv(tokens, hidden, pos)
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        logits, hidden = self.finish(self.attend(q, k0, v0, causal), res)
        out = [self.draft_to_target[logits.argmax(-1)]]
        keys, values, masks = [k0], [v0], [causal]
        for _ in range(1, k):
            pos = pos + 1
            q, ks, vs, res = self.qkv(out[-1], hidden, pos)
            keys.append(ks)
            values.append(vs)
            masks.append(torch.eye(n, dtype=torch.bool))  # each draft row sees its own earlier steps
            attn = self.attend(q, torch.cat(keys), torch.cat(values), torch.cat(masks, 1))
            logits, hidden = self.finish(attn, res)
            out.append(self.draft_to_target[logits.argmax(-1)])
        return torch.stack(out, 1)


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tuner.models.demo import TARGET_NAME, demo_path
    from tuner.models.eagle3_data import default_aux_layers

    torch.set_num_threads(1)
    target = Path(args.target or demo_path(TARGET_NAME))
    head_dir = Path(args.head)
    tok: Any = AutoTokenizer.from_pretrained(str(target))
    model: Any = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    layers = model.model.layers
    cfg = json.loads((head_dir / "config.json").read_text())
    aux_ids = cfg.get("eagle_aux_hidden_state_layer_ids") or default_aux_layers(len(layers))
    read_ids = [i + args.aux_shift for i in aux_ids]
    head = Head(head_dir, model.model.embed_tokens.weight.detach().float())
    in_draft = torch.zeros(model.config.vocab_size, dtype=torch.bool)
    in_draft[head.draft_to_target] = True
    captured: dict[int, torch.Tensor] = {}

    def entering(i: int) -> Any:
        def hook(_m: Any, a: tuple[Any, ...], kw: dict[str, Any]) -> None:
            captured[i] = (a[0] if a else kw["hidden_states"]).detach()[0]

        return hook

    for i in read_ids:
        layers[i].register_forward_pre_hook(entering(i), with_kwargs=True)

    sets: dict[str, list[Any]] = {Path(f).stem: load_prompts([f]) for f in args.prompts}
    marker = head_dir / "specdec-tuner.json"
    recipe = json.loads(marker.read_text()).get("result", {}).get("recipe", {}) if marker.is_file() else {}
    sets.update(builder_prompt_sets(recipe, args.train_heldout, args.train_seen))
    if args.responses:
        from tuner.models.eagle3_data import read_responses, select_shortest

        rows = select_shortest(read_responses(Path(args.responses)), args.sequences)
        split = int(len(rows) * args.train_ratio)
        sets["val"] = rows[split:]
        sets["train"] = rows[: args.train_rows]
    results: dict[str, dict[str, Any]] = {}
    with torch.inference_mode():
        for name, prompts in sets.items():
            start = time.perf_counter()
            full = torch.zeros(args.k)
            restricted = torch.zeros(args.k)
            positions = covered = answers = 0
            for item in prompts:
                if isinstance(item, dict):  # a training sequence: the target's answer is already there
                    gen = torch.tensor(item["prompt_ids"] + item["answer_ids"])
                    p_len = len(item["prompt_ids"])
                else:
                    encoded: Any = tok.apply_chat_template(item, add_generation_prompt=True, return_tensors="pt")
                    prompt = encoded if isinstance(encoded, torch.Tensor) else encoded["input_ids"]
                    gen = model.generate(prompt, max_new_tokens=args.max_tokens, do_sample=False)[0]
                    p_len = prompt.shape[1]
                captured.clear()
                out = model(gen[None], use_cache=False)
                logits = out.logits[0]
                aux = torch.cat([captured[i] for i in read_ids], -1)
                drafts = head.draft(aux, gen, args.k)  # row t drafts tokens t+2..t+1+k
                greedy = logits.argmax(-1)  # greedy[t] = the target's token after position t
                masked = logits.masked_fill(~in_draft, float("-inf")).argmax(-1)
                # vLLM's drafts: row t (target hidden state of position t, token t+1) drafts tokens
                # t+2..; the first is row p_len - 1 (fed the first answer token), as speculators'
                # loss mask after its shift; step j is checked while token t+2+j is in the sequence.
                starts = torch.arange(p_len - 1, gen.shape[0] - 2)
                ok_full = torch.ones(len(starts), dtype=torch.bool)
                ok_restr = torch.ones(len(starts), dtype=torch.bool)
                for j in range(args.k):
                    valid = starts + 1 + j < gen.shape[0] - 1
                    idx = (starts + 1 + j).clamp(max=gen.shape[0] - 1)
                    ok_full &= (drafts[starts, j] == greedy[idx]) & valid
                    ok_restr &= (drafts[starts, j] == masked[idx]) & valid
                    full[j] += ok_full.sum()
                    restricted[j] += ok_restr.sum()
                positions += len(starts)
                answer = gen[p_len:]
                answers += len(answer)
                covered += int(in_draft[answer].sum())
            results[name] = {
                "prompts": len(prompts),
                "positions": positions,
                "full_acc": (full / positions).tolist(),
                "full_acc_restricted": (restricted / positions).tolist(),
                "acceptance_length_bound": 1 + float((full / positions).sum()),
                "answer_tokens": answers,
                "coverage": covered / max(answers, 1),
                "seconds": time.perf_counter() - start,
            }
            r = results[name]
            print_table(
                ["prompts", "positions", "full_acc", "restricted", "AL", "coverage"],
                [
                    [
                        name,
                        positions,
                        " ".join(f"{x:.3f}" for x in r["full_acc"]),
                        " ".join(f"{x:.3f}" for x in r["full_acc_restricted"]),
                        f"{r['acceptance_length_bound']:.3f}",
                        f"{r['coverage']:.3f}",
                    ]
                ],
            )
            sys.stdout.flush()
    return {
        "target": str(target),
        "head": str(head_dir),
        "aux_layers": aux_ids,
        "read_layers": read_ids,
        "k": args.k,
        "max_tokens": args.max_tokens,
        "results": results,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--head", required=True)
    p.add_argument("--target")
    p.add_argument("--k", type=int, default=3)
    p.add_argument(
        "--prompts", nargs="*", default=["studies/prompts/smollm2-demo.jsonl", "studies/prompts/wide-h200.jsonl"]
    )
    p.add_argument("--train-heldout", type=int, default=0)
    p.add_argument("--train-seen", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--aux-shift", type=int, default=0)
    p.add_argument("--responses", help="a training run's responses.jsonl: evaluate its val split and some train rows")
    p.add_argument("--sequences", type=int, default=400)
    p.add_argument("--train-ratio", type=float, default=0.95)
    p.add_argument("--train-rows", type=int, default=40)
    p.add_argument("--out-dir", default="eagle3-head-20261205")
    args = p.parse_args()
    payload = evaluate(args)
    path = write_result_to(
        RESULTS / args.out_dir, "offline", "eagle3-head offline acceptance", "benchmarks.eagle3_offline", payload
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
