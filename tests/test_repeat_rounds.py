"""Nested repeats over nothing cannot hang: every round of every repeat counts against
MAX_REPEAT_ROUNDS, layers emitted or not, and the outer repeat stops after its first round when
that shows the whole would be too much (a repeat of 100 000 over a repeat of 100 000 over no
layers is ten billion empty rounds)."""

import time

import pytest
from one_line import cli_error

from superneuron.cli.plan import main as plan_main
from superneuron.errors import SpecError
from superneuron.limits import MAX_REPEAT_ROUNDS
from superneuron.netfile import expand, loader
from superneuron.netfile.spec import load_spec

HEAD = "name: t\ninput: {data: [2, 3, 4, 4], label: [2]}\n"
TAIL = "  - {name: fc, type: InnerProduct, bottom: data, top: fc, num_output: 3}\n"


def net(tmp_path, body, templates=""):
    path = tmp_path / "net.yaml"
    path.write_text(HEAD + templates + "layers:\n" + body + TAIL)
    return path


def test_ten_billion_empty_rounds_stop_at_once(tmp_path, capsys):
    path = net(tmp_path, "  - {repeat: 100000, layers: [{repeat: 100000, layers: []}]}\n")
    start = time.perf_counter()
    line = cli_error(capsys, plan_main, [path])
    assert time.perf_counter() - start < 30  # one round of the outer repeat, not ten billion
    assert line == (f"error: {path}:4:14: repeat 100000 whose first round made 100001 rounds of nested "
                    f"repeats: a file whose repeats make about 10 000 100 000 rounds is over the limit of "
                    f"1 000 000 rounds (MAX_REPEAT_ROUNDS)")


def test_through_templates_too(tmp_path):
    templates = ("templates:\n  nothing: []\n"
                 "  many: [{repeat: 100000, use: nothing}]\n")
    path = net(tmp_path, "  - {repeat: 100000, use: many}\n", templates)
    with pytest.raises(SpecError, match=r"net.yaml:7:14: repeat 100000 whose first round made 100001 rounds "
                                        r"of nested repeats: .* \(MAX_REPEAT_ROUNDS\)$"):
        load_spec(path)


@pytest.mark.parametrize("outer, inner, fits", [(10, 99, True), (10, 100, False), (1001, 0, False),
                                                (1000, 0, True), (2, 499, True), (3, 400, False)])
def test_the_limit_counts_every_round_exactly(outer, inner, fits, tmp_path, monkeypatch):
    """Rounds counted: ``outer * (1 + inner)``, each against the limit (here 1 000)."""
    monkeypatch.setattr(expand, "MAX_REPEAT_ROUNDS", 1000)
    path = net(tmp_path, f"  - {{repeat: {outer}, layers: [{{repeat: {inner}, layers: []}}]}}\n")
    if fits:
        assert [ls.name for ls in load_spec(path).layers] == ["input", "fc"]
    else:
        with pytest.raises(SpecError, match=r"MAX_REPEAT_ROUNDS"):
            load_spec(path)


def test_real_nets_make_fewer_rounds_than_layers():
    """ResNet-15002 (65 022 layers) makes 15 009 rounds, as limits.py says; ResNet-1202 here."""
    loaded = loader.Loader("nets/resnet.yaml", {"depth": 1202}, None)
    with open("nets/resnet.yaml") as f:
        loaded.load(f.read())
    assert loaded.rounds == 1209 and len(loaded.layers) > 4 * loaded.rounds
    assert 15002 * loaded.rounds / 1202 < MAX_REPEAT_ROUNDS // 50
