#!/usr/bin/env python3
"""Writes the small torch.save files of tests/data/torch/ that the unpickler tests read.

Made with Debian 12's python3-torch (torch 1.13.0a0) and Python 3.11: `python3 make_torch2_pickles.py`
in this folder. torch 1.13 pickles a plain tensor or a Parameter that carries Python attributes as if
it had none; torch 2.x (whose files DeepSpeed writes today) wraps them instead. So that these files
hold the bytes torch 2.x writes, `reduce_like_torch2` below returns what torch 2.x's
Tensor.__reduce_ex__ and Parameter.__reduce_ex__ return:

  tensor with attributes:    _rebuild_from_type_v2(_rebuild_tensor_v2, torch.Tensor, (storage, ...), state)
  Parameter with attributes: _rebuild_parameter_with_state(tensor, requires_grad, OrderedDict(), state)
  Parameter without:         _rebuild_parameter(tensor, requires_grad, OrderedDict())

where `state` is the object's attribute dict (DeepSpeed stage 3 gives its fp32 partitions
{'ds_id': '0_20'}). The refused files use the same wrapping with a type or a function that a checkpoint
never names. Storage records are written by torch.save itself.
"""
from collections import OrderedDict

import torch
import torch._tensor
import torch._utils


def _rebuild_parameter_with_state(data, requires_grad, backward_hooks, state):
    return torch.nn.Parameter(data, requires_grad)


# torch 1.13 lacks it; pickle names it by module and name, as torch 2.x does.
_rebuild_parameter_with_state.__module__ = "torch._utils"
torch._utils._rebuild_parameter_with_state = _rebuild_parameter_with_state


class Wrapped:
    """Pickles as _rebuild_from_type_v2(func, type, args, state) around `tensor`."""

    def __init__(self, tensor, func=None, cls=torch.Tensor, state=None):
        self.tensor, self.func, self.cls, self.state = tensor, func, cls, state

    def __reduce_ex__(self, proto):
        func, args = self.tensor._reduce_ex_internal(proto)
        return (torch._tensor._rebuild_from_type_v2, (self.func or func, self.cls, args, self.state))


class ParamWithState:
    def __init__(self, tensor, state):
        self.tensor, self.state = tensor, state

    def __reduce_ex__(self, proto):
        return (torch._utils._rebuild_parameter_with_state, (self.tensor, True, OrderedDict(), self.state))


class SubTensor(torch.Tensor):
    """A tensor subclass: torch pickles its type by name (here __main__.SubTensor)."""


def main():
    ds_state = {'ds_id': '0_20', 'ds_shape': torch.Size([3]), 'ds_numel': 3, 'ds_persist': False}
    torch.save(
        {
            'tensor_with_attributes': Wrapped(torch.tensor([1.0, 2.0, 3.0]), state=dict(ds_state)),
            'parameter_with_attributes': ParamWithState(torch.tensor([4.0, 5.0]), {'ds_id': 7}),
            'parameter_as_type': Wrapped(torch.tensor([6.0]), cls=torch.nn.Parameter, state=None),
            'parameter': torch.nn.Parameter(torch.tensor([7.0, 8.0])),
            # Keys DeepSpeed 0.16+ adds, with the values it writes.
            'checkpoint_parallel_dimensions': {'pp_degree': 1, 'tp_degree': 1},
            'ds_zero_partition_groups': [{'partition_count': 2, 'partition_rank': 0}],
            'universal_checkpoint_info': {'universal_checkpoint_version': 0.2,
                                          'tp_replicated_parameter_patterns': ['.*norm.*'],
                                          'original_vocab_size': 256},
        }, 'torch2_tensors.pt')
    torch.save({'x': torch.tensor([1.0]).as_subclass(SubTensor)}, 'subclass_type.pt')
    torch.save({'x': Wrapped(torch.tensor([1.0]), cls=torch.Size)}, 'size_as_type.pt')
    torch.save({'x': Wrapped(torch.tensor([1.0]), func=OrderedDict)}, 'ordereddict_as_function.pt')
    torch.save({'x': Wrapped(torch.tensor([1.0]), func=torch._utils._rebuild_tensor)}, 'unknown_function.pt')


if __name__ == '__main__':
    main()
