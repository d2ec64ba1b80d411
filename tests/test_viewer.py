"""The HTML viewer: one self-contained page, every piece of model output escaped, fast at 10,000 groups.

The page's script is also run under node (when installed) against a small DOM stand-in that refuses
innerHTML, to check that it renders a page of cards, filters, pages and answers the keys it documents.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from atropos_cli.formats.html import PAGE_SIZE, embed_json, render_html
from atropos_cli.formats.reader import BadRecord, SourcedGroup
from atropos_cli.types import GroupMeta, RolloutMeta, ScoredGroup

XSS = "<script>alert(1)</script> and </script><img src=x onerror=alert(2)> & <!--"


def group(scores: list[float], answer: str = "4", item: str = "train-0", env: str = "arithmetic") -> ScoredGroup:
    prompt = [{"role": "system", "content": "answer with a number"}, {"role": "user", "content": "2 + 2"}]
    return ScoredGroup(
        scores=scores,
        messages=[[*prompt, {"role": "assistant", "content": f"{answer} #{j}"}] for j in range(len(scores))],
        masks=[[-100, -100, 5, 6]] * len(scores),
        tokens=[[1, 2, 5, 6]] * len(scores),
        meta=GroupMeta(
            env=env,
            item_id=item,
            model="tiny",
            rollouts=[RolloutMeta(finish_reason="stop", reward_parts={"correct": s}) for s in scores],
        ),
    )


def sourced(groups: list[ScoredGroup], source: str = "runs/arith/groups.jsonl") -> list[SourcedGroup]:
    return [SourcedGroup(source, i, g) for i, g in enumerate(groups)]


def data_block(html: str) -> dict:
    match = re.search(r'<script type="application/json" id="atropos-data">(.*?)</script>', html, re.S)
    assert match, "no data block"
    return json.loads(match.group(1))


def inline_script(html: str) -> str:
    return re.findall(r"<script>(.*?)</script>", html, re.S)[-1]


def test_model_output_is_escaped_everywhere(tmp_path: Path) -> None:
    evil = group([1.0, 0.0], answer=XSS, item=XSS)
    bad = [BadRecord("runs/x/groups.jsonl:17", f"not valid JSON ({XSS})")]
    out = render_html(sourced([evil]), tmp_path / "v.html", title=f"run {XSS}", bad_records=bad)
    html = out.read_text(encoding="utf-8")
    assert "<script>alert(1)</script>" not in html
    assert "<img src=x" not in html and "<!--" not in html
    assert html.count("<script") == 2 and html.count("</script>") == 2  # only the page's own two blocks
    assert "\\u003cscript\\u003ealert(1)\\u003c/script\\u003e" in html  # data: \u escapes
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # title and skipped-line list: HTML entities
    payload = data_block(html)
    assert payload["groups"][0]["r"][0]["m"][0] == ["assistant", f"{XSS} #0"]  # the exact text survives
    assert payload["groups"][0]["item"] == XSS


def test_embed_json_leaves_nothing_that_can_close_the_tag() -> None:
    text = embed_json({"a": "</script><!-- \u2028 & >"})
    assert not set("<>&") & set(text) and "\u2028" not in text
    assert json.loads(text) == {"a": "</script><!-- \u2028 & >"}


def test_page_is_one_self_contained_file_with_stats_keys_and_page_size(tmp_path: Path) -> None:
    groups = [group([1.0, 0.0, 0.0, -0.5]), group([1.0, 1.0, 1.0, 1.0]), group([0.0, 0.0, 0.0, 0.0])]
    out = render_html(
        sourced(groups),
        tmp_path / "sub" / "index.html",
        title="arith",
        failures=3,
        bad_records=[BadRecord("g.jsonl:2", "not valid JSON (x)")],
    )
    html = out.read_text(encoding="utf-8")
    assert list((tmp_path / "sub").iterdir()) == [out]
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # no CDN, nothing remote
    assert "<link" not in html and "@import" not in html
    for number, label in [(3, "groups"), (12, "rollouts"), (3, "failed rollouts"), (1, "bad lines skipped")]:
        assert re.search(rf'<div class="n"[^>]*>{number}</div><div class="l">{label}</div>', html), label
    assert '<div class="n">0.375</div><div class="l">mean score (-0.5 to 1)</div>' in html
    assert html.count("<rect ") == 20 and "<title>0.925 to 1: 5</title>" in html
    assert 'class="zero" x="61"' in html  # the bin holding 0 is amber
    assert f"Groups are listed {PAGE_SIZE} per page" in html and PAGE_SIZE == 100
    for key in ("<kbd>j</kbd>", "<kbd>k</kbd>", "<kbd>Enter</kbd>", "<kbd>Space</kbd>", "<kbd>/</kbd>"):
        assert key in html
    assert "g.jsonl:2: not valid JSON (x)" in html
    assert "innerHTML" not in html


def test_payload_shows_the_prompt_once_and_each_rollout_with_its_diagnostics(tmp_path: Path) -> None:
    out = render_html(sourced([group([1.0, 0.0])]), tmp_path / "v.html", title="t")
    card = data_block(out.read_text(encoding="utf-8"))["groups"][0]
    assert card["pm"] == [["system", "answer with a number"], ["user", "2 + 2"]]
    assert card["r"][1] == {"sc": 0.0, "m": [["assistant", "4 #1"]], "fr": "stop", "p": {"correct": 0.0}, "nt": 2}
    assert (card["env"], card["item"], card["model"], card["mean"], card["i"]) == (
        "arithmetic",
        "train-0",
        "tiny",
        0.5,
        0,
    )


def test_groups_without_messages_or_meta_still_render(tmp_path: Path) -> None:
    bare = ScoredGroup(tokens=[[1, 2]], masks=[[-100, 2]], scores=[-1.0])
    out = render_html(sourced([bare], "a.jsonl"), tmp_path / "v.html", title="t")
    card = data_block(out.read_text(encoding="utf-8"))["groups"][0]
    assert card == {"s": 0, "i": 0, "mean": -1.0, "r": [{"sc": -1.0, "m": [["token ids", "1 2"]], "nt": 1}]}


def test_an_empty_run_renders_a_page(tmp_path: Path) -> None:
    out = render_html([], tmp_path / "v.html", title="empty", failures=4)
    html = out.read_text(encoding="utf-8")
    assert data_block(html)["groups"] == [] and "<rect" not in html and "n/a" in html


def test_ten_thousand_groups_render_into_one_page(tmp_path: Path) -> None:
    """Every group is in the page (its speed: benchmarks/check_budgets.py)."""
    groups = [
        group([float(i % 3) - 1, 1.0, 0.0, 0.5], answer=f"answer {i} " * 10, item=f"train-{i}") for i in range(10_000)
    ]
    out = render_html(sourced(groups), tmp_path / "big.html", title="big")
    size = out.stat().st_size
    html = out.read_text(encoding="utf-8")
    assert 2_000_000 < size < 40_000_000
    assert len(data_block(html)["groups"]) == 10_000 and html.rstrip().endswith("</html>")
    assert '<div class="n" id="stat-groups">10000</div>' in html


# --- the page's script, run under node against a minimal DOM ---------------------------------------------

DOM_SHIM = r"""
const fs = require("fs");
const input = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
class El {
  constructor(tag) { this.tagName = tag.toUpperCase(); this.kids = []; this.className = ""; this.style = {};
    this.text = ""; this.on = {}; this.value = ""; this.disabled = false; this._open = false; this.id = "";
    const el = this;
    this.classList = { add(c) { if (!el.has(c)) el.className = (el.className + " " + c).trim(); },
      remove(c) { el.className = el.className.split(" ").filter(x => x !== c).join(" "); } }; }
  has(c) { return this.className.split(" ").includes(c); }
  set innerHTML(v) { throw new Error("innerHTML used"); }
  set textContent(v) { this.kids = []; this.text = String(v); }
  get textContent() { return this.text + this.kids.map(k => k.textContent).join(""); }
  get firstChild() { return this.kids[0] || null; }
  appendChild(c) { if (c.tagName === "#FRAG") { c.kids.forEach(k => this.appendChild(k)); c.kids = []; }
    else { c.parent = this; this.kids.push(c); } return c; }
  removeChild(c) { this.kids = this.kids.filter(k => k !== c); return c; }
  addEventListener(t, f) { (this.on[t] = this.on[t] || []).push(f); }
  fire(t, e) { (this.on[t] || []).forEach(f => f(e || { target: this })); }
  get open() { return this._open; }
  set open(v) { const was = this._open; this._open = !!v; if (was !== this._open) this.fire("toggle"); }
  all() { return this.kids.flatMap(k => [k, ...k.all()]); }
  querySelectorAll(sel) { const [tag, cls] = sel.split(".");
    return this.all().filter(n => (!tag || n.tagName === tag.toUpperCase()) && (!cls || n.has(cls))); }
  querySelector(sel) { return this.querySelectorAll(sel)[0] || null; }
  focus() { document.activeElement = this; } blur() {} scrollIntoView() {}
}
const byId = {}, extras = {};
for (const id of input.ids) { byId[id] = new El(id === "atropos-data" ? "script" : "input"); byId[id].id = id; }
byId["atropos-data"].textContent = input.data;
byId["groups"] = new El("div");
if (byId["sort"]) byId["sort"].value = "file";
for (const cls of ["page-info", "prev", "next"]) extras[cls] = [new El("span"), new El("span")];
const docListeners = {};
global.document = {
  getElementById: id => byId[id] || null,
  createElement: tag => new El(tag),
  createDocumentFragment: () => new El("#frag"),
  querySelectorAll: sel => extras[sel.slice(1)] || [],
  addEventListener: (t, f) => { docListeners[t] = f; },
};
global.window = { scrollTo() {} };
let prevented = 0;
function key(k, target) { docListeners.keydown({ key: k, target: target || { tagName: "BODY" },
  preventDefault() { prevented++; } }); }
new Function(input.script)();
const list = byId["groups"], out = {};
const cards = () => list.querySelectorAll("details.card");
out.cards = cards().length;
out.count = byId["count"].textContent;
out.pageInfo = extras["page-info"][0].textContent;
key("j"); key("j"); out.active = cards().findIndex(c => c.has("active"));
key("Enter"); out.opened = cards()[1].open;
out.body = cards()[1].textContent;
key("k"); out.activeAfterK = cards().findIndex(c => c.has("active"));
key("n"); out.pageInfo2 = extras["page-info"][0].textContent; out.firstOnPage2 = cards()[0].textContent.slice(0, 40);
key("/"); out.searchFocused = document.activeElement === byId["search"];
byId["search"].value = "needle"; byId["search"].fire("input");
setTimeout(() => {
  out.filtered = cards().length; out.filteredCount = byId["count"].textContent;
  byId["search"].value = ""; byId["min-score"].value = "0.9"; byId["min-score"].fire("change");
  out.minFiltered = cards().length;
  out.prevented = prevented;
  process.stdout.write(JSON.stringify(out));
}, 300);
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_page_script_renders_pages_filters_and_keys_under_node(tmp_path: Path) -> None:
    groups = [group([0.0, 1.0], answer=XSS if i == 1 else f"plain {i}", item=f"item-{i}") for i in range(250)]
    groups[170] = group([1.0, 1.0], answer="the needle is here", item="item-170")
    html = render_html(sourced(groups), tmp_path / "v.html", title="t").read_text(encoding="utf-8")
    data_text = re.search(r'id="atropos-data">(.*?)</script>', html, re.S).group(1)
    spec = {"ids": re.findall(r'id="([^"]+)"', html), "data": data_text, "script": inline_script(html)}
    (tmp_path / "input.json").write_text(json.dumps(spec), encoding="utf-8")
    (tmp_path / "shim.js").write_text(DOM_SHIM, encoding="utf-8")
    done = subprocess.run(
        ["node", str(tmp_path / "shim.js"), str(tmp_path / "input.json")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["cards"] == 100 and out["count"] == "showing 1–100 of 250 groups"
    assert out["pageInfo"] == "page 1 of 3" and out["pageInfo2"] == "page 2 of 3"
    assert out["active"] == 1 and out["opened"] is True and out["activeAfterK"] == 0
    assert XSS in out["body"] and "answer with a number" in out["body"] and "finish: stop" in out["body"]
    assert out["firstOnPage2"].startswith("group 100")
    assert out["searchFocused"] is True
    assert out["filtered"] == 1 and out["filteredCount"] == "showing 1–1 of 1 groups (filtered from 250)"
    assert out["minFiltered"] == 1  # only group 170 has a mean score >= 0.9
    assert out["prevented"] == 6


def test_token_only_groups_are_decoded_with_the_runs_tokenizer(tmp_path: Path) -> None:
    """A ported env's group has tokens and masks but no messages: the page shows the decoded prompt and
    completion, read with the tokenizer the run's config.yaml names."""
    from atropos_cli.formats.html import run_decoder
    from atropos_cli.resources import resolve_model_path

    config = tmp_path / "config.yaml"
    config.write_text(f"env:\n  tokenizer_name: {resolve_model_path('atropos-tiny-arith')}\nopenai: []\n")
    tokens = [3, 265, 264, 225, 22, 267, 225, 23, 35, 1, 4, 25, 1]  # <|user|>What is 2 + 3?<|end|><|assistant|>5<|end|>
    group = ScoredGroup(tokens=[tokens], masks=[[-100] * 11 + [25, 1]], scores=[1.0])
    out = render_html(sourced([group], "a.jsonl"), tmp_path / "v.html", title="t", decode=run_decoder(config))
    rows = data_block(out.read_text(encoding="utf-8"))["groups"][0]["r"][0]["m"]
    assert rows == [
        ["prompt (decoded tokens)", "<|user|>What is 2 + 3?<|end|><|assistant|>"],
        ["completion (decoded tokens)", "5<|end|>"],
    ]
