"""Output axes named from the graph's own runs at three shapes (export_onnx.name_output_axes): only where the
sizes seen say so unambiguously."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from pipeline.stages.export_onnx import _reason, name_output_axes


def _graph(outputs: dict[str, list[str | int]]) -> onnx.ModelProto:
    values = [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n, dims in outputs.items()]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence"])
    return helper.make_model(helper.make_graph([], "g", [x], values))


def _dims(model: onnx.ModelProto) -> dict[str, list[str | int]]:
    return {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.output
    }


def test_axes_take_a_dims_name_or_a_fixed_size_only_where_every_run_agrees() -> None:
    runs = [
        (
            {"batch": 1, "sequence": 4},
            {"hidden": [1, 4, 64], "blocks": [1, 1], "ids": [1, 7], "pair": [1, 1]},
        ),
        (
            {"batch": 2, "sequence": 32},
            {"hidden": [2, 32, 64], "blocks": [2, 2], "ids": [2, 7], "pair": [2, 2]},
        ),
        (
            {"batch": 3, "sequence": 16},
            {"hidden": [3, 16, 64], "blocks": [3, 1], "ids": [3, 7], "pair": [3, 3]},
        ),
    ]
    model = _graph(
        {
            "hidden": ["Add_dim_0", "Add_dim_1", "Add_dim_2"],
            "blocks": ["B_dim_0", "B_dim_1"],  # ceil(sequence / 16): 1 and 2 at the corners, like a batch
            "ids": ["I_dim_0", "I_dim_1"],
            "pair": ["P_dim_0", "P_dim_1"],  # [batch, batch]: both axes the batch
        }
    )
    name_output_axes(model, runs)
    assert _dims(model) == {
        "hidden": ["batch", "sequence", 64],
        "blocks": ["batch", "B_dim_1"],  # the third run's batch (3) tells it from the batch
        "ids": ["batch", 7],
        "pair": ["batch", "batch"],
    }


def test_axes_named_after_a_recipe_dim_fixed_axes_and_outputs_the_runs_lack_are_left_alone() -> None:
    runs = [
        ({"batch": 1, "sequence": 4}, {"y": [1, 5]}),
        ({"batch": 2, "sequence": 32}, {"y": [2, 5]}),
        ({"batch": 3, "sequence": 16}, {"y": [3, 5]}),
    ]
    model = _graph({"y": ["sequence", 6], "z": ["Z_dim_0"]})
    name_output_axes(model, runs)
    assert _dims(model) == {"y": ["sequence", 6], "z": ["Z_dim_0"]}


def test_a_dynamic_dim_the_graph_fixed_is_named_with_its_inputs_and_range() -> None:
    """export_onnx._fixed_dynamic_axes: a dim declared dynamic (min < max) that the graph holds as a number is
    the dynamo export's failure; a dim with min == max, a fixed axis the recipe fixes too, and a recipe input
    the graph dropped are not."""
    from types import SimpleNamespace

    from pipeline.recipe.sources import DimRange, InputSpec
    from pipeline.stages.export_onnx import _fixed_dynamic_axes

    inputs = [
        helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 16]),
        helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", 16]),
        helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 8]),
    ]
    model = helper.make_model(helper.make_graph([], "g", inputs, []))
    spec = SimpleNamespace(
        inputs=[
            InputSpec(name="ids", dtype="int64", shape=["batch", "sequence"]),
            InputSpec(name="mask", dtype="int64", shape=["batch", "sequence"]),
            InputSpec(name="image", shape=["batch", 3, "side"]),
            InputSpec(name="dropped", shape=["batch", "sequence"]),
        ],
        dims={
            "batch": DimRange(min=1, opt=2, max=8),
            "sequence": DimRange(min=4, opt=16, max=32),
            "side": DimRange(min=8, opt=8, max=8),
        },
    )
    why = _fixed_dynamic_axes(model, spec)
    assert why is not None and why.startswith(
        "the graph fixes 'sequence' (4..32 in the recipe) at 16 on ids axis 1, mask axis 1: "
    ), why
    assert "side" not in why and "image" not in why and "dropped" not in why
    spec.dims["sequence"] = DimRange(min=16, opt=16, max=16)
    assert _fixed_dynamic_axes(model, spec) is None


def test_a_dynamo_failure_is_said_by_its_cause_and_the_models_line_not_the_exporters_insides() -> None:
    """A hold-out Swin's fallback reason quoted the FX node dynamo was executing and a traceback cut off
    mid-path; what it kept of the message now ends with the innermost frame: where in the model it failed."""
    message = (
        "<class 'ValueError'>: Cannot view a tensor with shape torch.Size([4*s33, 16, 2, 8]) and strides "
        "(256, 8, 128, 1) as a tensor with shape (4*s33, 16, 16)!\n\nWhile executing %view_10 : [num_users=1] = "
        "call_function[target=torch.ops.aten.view.default](args = (%transpose_5, [%mul_39, 16, -1]), kwargs = {})"
        '\nOriginal traceback:\n  File "/work/main/pipeline/inputs/models.py", line 233, in forward\n'
        "    return pick_outputs(self.raw(*args), self.output_names)\n"
        '  File "/site-packages/transformers/models/swin/modeling_swin.py", line 412, in window_reverse\n'
        "    windows = windows.view(-1, height, width, num_channels)\n"
    )
    assert _reason(ValueError(message)) == (
        "ValueError: <class 'ValueError'>: Cannot view a tensor with shape torch.Size([4*s33, 16, 2, 8]) and "
        "strides (256, 8, 128, 1) as a tensor with shape (4*s33, 16, 16)! (in window_reverse, "
        "modeling_swin.py line 412)"
    )
