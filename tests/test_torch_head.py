"""The hand-written head: log pi(target) and its gradients equal autograd's on the plain formula."""

import pytest
import torch

from swarmling.backends.torch_head import token_logprobs


def plain(hidden, weight, targets, temperature, softcap):
    logits = torch.nn.functional.linear(hidden, weight)
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, targets[:, None]).squeeze(-1)


@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("chunk", [7, 64])  # several chunks, or one
@pytest.mark.parametrize("keep", [True, False])
def test_values_and_gradients_match_autograd(softcap, chunk, keep, monkeypatch):
    import swarmling.backends.torch_head as head

    monkeypatch.setattr(head, "KEEP_LOGITS_BYTES", 2**40 if keep else 0)
    torch.manual_seed(0)
    hidden = torch.randn(20, 16, dtype=torch.float64)
    weight = torch.randn(50, 16, dtype=torch.float64)
    targets = torch.randint(0, 50, (20,))
    upstream = torch.randn(20, dtype=torch.float64)
    results = []
    for f in (plain, lambda h, w, t, T, c: token_logprobs(h, w, t, T, c, chunk)):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        out = f(h, w, targets, 0.7, softcap)
        (out * upstream).sum().backward()
        results.append((out.detach(), h.grad, w.grad))
    for ours, theirs in zip(results[1], results[0]):
        torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-9)
    assert results[1][1].abs().sum() > 0 and results[1][2].abs().sum() > 0  # gradients really flowed


def test_bf16_hidden_states_meet_an_fp32_head_in_fp32():
    """The CPU's bf16 base hands bf16 hidden states to its fp32 head: the logprobs and the
    gradient are those of the fp32 formula on the same (bf16-valued) inputs, at T != 1."""
    torch.manual_seed(1)
    hidden = torch.randn(12, 16).bfloat16()
    weight = torch.randn(40, 16)
    targets = torch.randint(0, 40, (12,))
    ours_h, theirs_h = hidden.clone().requires_grad_(), hidden.float().requires_grad_()
    ours = token_logprobs(ours_h, weight, targets, 0.7, None, 5)
    theirs = plain(theirs_h, weight, targets, 0.7, None)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    ours.sum().backward()
    theirs.sum().backward()
    assert ours_h.grad.dtype == torch.bfloat16
    torch.testing.assert_close(ours_h.grad.float(), theirs_h.grad, rtol=1e-2, atol=1e-2)  # bf16's rounding


def test_a_frozen_weight_gets_no_gradient():
    hidden = torch.randn(5, 8, requires_grad=True)
    weight = torch.randn(30, 8)
    token_logprobs(hidden, weight, torch.randint(0, 30, (5,)), 1.0, None, 4).sum().backward()
    assert hidden.grad is not None and weight.grad is None
