"""The rules of ampfix: one module a rule; register each one here, one line a rule."""
from ampfix.rules.apex_usage import ApexUsage
from ampfix.rules.cpu_tensor_to_device import CpuTensorToDevice
from ampfix.rules.dataparallel_autocast import DataParallelAutocast
from ampfix.rules.deprecated_cuda_amp import DeprecatedCudaAmp
from ampfix.rules.sync_in_loop import SyncInLoop
from ampfix.rules.zero_grad import ZeroGrad

RULES = [
    ApexUsage,
    DataParallelAutocast,
    DeprecatedCudaAmp,
    ZeroGrad,
    CpuTensorToDevice,
    SyncInLoop,
]
