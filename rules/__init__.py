"""The rules of ampfix: one module a rule; register each one here, one line a rule."""
from ampfix.rules.apex_usage import ApexUsage
from ampfix.rules.cpu_tensor_to_device import CpuTensorToDevice
from ampfix.rules.dataparallel_autocast import DataParallelAutocast
from ampfix.rules.deprecated_cuda_amp import DeprecatedCudaAmp
from ampfix.rules.sync_in_loop import SyncInLoop
from ampfix.rules.scaler_in_loop import ScalerInLoop
from ampfix.rules.step_bypasses_scaler import StepBypassesScaler
from ampfix.rules.scaler_update import ScalerUpdate
from ampfix.rules.clip_scaled_grads import ClipScaledGrads
from ampfix.rules.backward_in_autocast import BackwardInAutocast
from ampfix.rules.manual_half import ManualHalf
from ampfix.rules.scaler_dtype import ScalerDtype
from ampfix.rules.custom_fwd_device import CustomFwdDevice
from ampfix.rules.zero_grad import ZeroGrad

RULES = [
    ApexUsage,
    DataParallelAutocast,
    DeprecatedCudaAmp,
    ZeroGrad,
    CpuTensorToDevice,
    SyncInLoop,
    ScalerInLoop,
    StepBypassesScaler,
    ScalerUpdate,
    ClipScaledGrads,
    BackwardInAutocast,
    ManualHalf,
    ScalerDtype,
    CustomFwdDevice,
]
