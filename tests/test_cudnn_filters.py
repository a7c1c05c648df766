"""cuDNN's engine filters (layers/cudnn.py) on a fake cuDNN Frontend: a graph offers engines,
each with its numerical notes and its workspace, and ``deselect_numeric_notes`` leaves out
those with a given note, as the frontend does. Which engine becomes ``cudnn`` (the best-ranked
left) then shows which filters acted: TF32's always unless asked for, non-deterministic ones
under ``deterministic``, FFT, Winograd and reduced-precision reductions under ``exact``."""

import types

import pytest

from superneuron.layers import cudnn as cudnn_layer

NOTES = ("TENSOR_CORE", "DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION", "FFT", "NONDETERMINISTIC",
         "WINOGRAD", "WINOGRAD_TILE_4x4", "WINOGRAD_TILE_6x6", "WINOGRAD_TILE_13x13", "STRICT_NAN_PROP")

# cuDNN's ranking, best first: (workspace bytes, notes); the workspace names the engine
ENGINES = [(700, {"TENSOR_CORE"}), (600, {"FFT"}), (500, {"WINOGRAD_TILE_6x6"}),
           (400, {"NONDETERMINISTIC"}), (300, {"REDUCED_PRECISION_REDUCTION"}),
           (200, {"STRICT_NAN_PROP"}), (0, set())]


class FakeTensor:
    def __getattr__(self, name):  # set_output, set_data_type, set_dim, set_stride: chained
        return lambda *a, **k: self


class FakeGraph:
    def __init__(self, **_):
        self.plans, self.selected = [], None

    def tensor(self, **_):
        return FakeTensor()

    conv_fprop = conv_dgrad = conv_wgrad = tensor

    def validate(self):
        pass

    build_operation_graph = validate

    def create_execution_plans(self, modes):
        self.plans = list(ENGINES)

    def deselect_numeric_notes(self, notes):
        self.plans = [p for p in self.plans if not p[1] & set(notes)]

    def check_support(self):
        if not self.plans:
            raise RuntimeError("no engine left")

    def get_execution_plan_count(self):
        return len(self.plans)

    def build_plan_at_index(self, index):
        self.selected = index

    def get_workspace_size(self):
        return self.plans[self.selected][0]


FAKE = types.SimpleNamespace(data_type=types.SimpleNamespace(FLOAT="float"),
                             heur_mode=types.SimpleNamespace(A="a", FALLBACK="fallback"),
                             numerical_note=types.SimpleNamespace(**{n: n for n in NOTES}),
                             pygraph=FakeGraph)
KEY = ((2, 4, 8, 8, 4, 1, 8, 8), (3, 3), (1, 1), (1, 1), (1, 1))


@pytest.mark.parametrize("tf32, deterministic, exact, chosen", [
    (False, False, False, 600),   # TF32's engine left out: FFT is the best of the rest
    (True, False, False, 700),
    (False, True, False, 600),    # FFT is deterministic: still chosen
    (False, False, True, 400),    # no FFT, no Winograd: the non-deterministic one
    (False, True, True, 200),     # nor that, nor the reduced-precision one
])
def test_the_best_engine_left_by_the_filters_is_the_one_used(tf32, deterministic, exact, chosen):
    lib = cudnn_layer.Cudnn(FAKE, handle=None, tf32=tf32, deterministic=deterministic, exact=exact)
    algos = {a.name: a.workspace for a in lib.conv_algorithms(KEY, "forward")}
    assert algos == {"cudnn": chosen, "cudnn_lean": 0}
    backward = {a.name: a.workspace for a in lib.conv_algorithms(KEY, "backward")}
    assert backward == {"cudnn": chosen, "cudnn_lean": 0}  # the larger of dgrad's and wgrad's


def test_excluded_notes_names_each_filters_notes_and_skips_what_the_frontend_lacks():
    notes = types.SimpleNamespace(TENSOR_CORE=1, FFT=2, WINOGRAD=3, NONDETERMINISTIC=4)
    assert cudnn_layer.excluded_notes(notes) == [1]
    assert cudnn_layer.excluded_notes(notes, tf32=True) == []
    assert cudnn_layer.excluded_notes(notes, tf32=True, deterministic=True) == [4]
    assert cudnn_layer.excluded_notes(notes, exact=True) == [1, 2, 3]


def test_the_environment_chooses_the_filters(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "cudnn", types.SimpleNamespace(create_handle=lambda: "h"))
    monkeypatch.setenv("SN_CUDNN_EXACT", "1")
    monkeypatch.setenv("SN_DETERMINISTIC", "0")
    lib, why = cudnn_layer.probe()
    assert why is None and lib.exact and not lib.deterministic and not lib.tf32


def test_more_candidates_offer_the_next_ranked_engines_each_in_its_own_graph(monkeypatch):
    """SN_CUDNN_CANDIDATES=4: the three best-ranked engines left with workspaces of their own,
    then the best needing none, for --profile to time (as cudnn.benchmark does)."""
    monkeypatch.setenv("SN_CUDNN_CANDIDATES", "4")
    lib = cudnn_layer.Cudnn(FAKE, handle=None, tf32=False, deterministic=False)
    algos = [(a.name, a.workspace) for a in lib.conv_algorithms(KEY, "forward")]
    assert algos == [("cudnn", 600), ("cudnn_2", 500), ("cudnn_3", 400), ("cudnn_lean", 0)]
    op = lib.op("fprop", KEY)
    graphs = {name: plan[0] for name, plan in op.plans.items()}
    assert len({id(g) for g in graphs.values()}) == 4  # one graph per plan, each with its own selected
    assert {name: g.get_workspace_size() for name, g in graphs.items()} == dict(algos)
    assert [a.speed for a in lib.conv_algorithms(KEY, "forward")] == sorted(
        [a.speed for a in lib.conv_algorithms(KEY, "forward")], reverse=True)
