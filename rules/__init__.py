"""The rules of ampfix: one module a rule; register each one here, one line a rule."""
from ampfix.rules.apex_amp import ApexAmp
from ampfix.rules.apex_dependency import ApexDependency
from ampfix.rules.apex_fp16_utils import ApexFp16Utils
from ampfix.rules.apex_normalization import ApexNormalization
from ampfix.rules.apex_optimizers import ApexOptimizers
from ampfix.rules.apex_other import ApexOther
from ampfix.rules.apex_parallel import ApexParallel
from ampfix.rules.apex_uninitialized import ApexUninitialized
from ampfix.rules.backward_after_unscale import BackwardAfterUnscale
from ampfix.rules.backward_in_autocast import BackwardInAutocast
from ampfix.rules.clip_scaled_grads import ClipScaledGrads
from ampfix.rules.conv_bias_bn import ConvBiasBeforeBn
from ampfix.rules.cpu_tensor_to_device import CpuTensorToDevice
from ampfix.rules.cudnn_benchmark import CudnnBenchmark
from ampfix.rules.custom_fwd_device import CustomFwdDevice
from ampfix.rules.dataloader_workers import DataLoaderWorkers
from ampfix.rules.dataparallel import DataParallel
from ampfix.rules.dataparallel_autocast import DataParallelAutocast
from ampfix.rules.ddp_no_sync import DdpNoSync
from ampfix.rules.debug_api import DebugApi
from ampfix.rules.deprecated_cuda_amp import DeprecatedCudaAmp
from ampfix.rules.determined_apex import DeterminedApex
from ampfix.rules.eval_no_grad import EvalNoGrad
from ampfix.rules.framework_config_apex import FrameworkConfigApex
from ampfix.rules.huggingface_apex import HuggingFaceApex
from ampfix.rules.lightning_apex import LightningApex
from ampfix.rules.manual_half import ManualHalf
from ampfix.rules.non_blocking import NonBlocking
from ampfix.rules.scaler_dtype import ScalerDtype
from ampfix.rules.scaler_in_loop import ScalerInLoop
from ampfix.rules.scaler_step_without_scale import ScalerStepWithoutScale
from ampfix.rules.scaler_unused import ScalerUnused
from ampfix.rules.scaler_update import ScalerUpdate
from ampfix.rules.step_bypasses_scaler import StepBypassesScaler
from ampfix.rules.sync_in_loop import SyncInLoop
from ampfix.rules.tensor_core_sizes import TensorCoreSizes
from ampfix.rules.unscale_once import UnscaleOnce
from ampfix.rules.zero_grad import ZeroGrad

RULES = [
    ApexOther,
    ApexAmp,
    ApexFp16Utils,
    ApexParallel,
    ApexOptimizers,
    ApexNormalization,
    ApexUninitialized,
    ApexDependency,
    LightningApex,
    HuggingFaceApex,
    DeterminedApex,
    FrameworkConfigApex,
    DataParallelAutocast,
    DeprecatedCudaAmp,
    ScalerInLoop,
    StepBypassesScaler,
    ScalerUpdate,
    UnscaleOnce,
    BackwardAfterUnscale,
    ClipScaledGrads,
    BackwardInAutocast,
    ManualHalf,
    ScalerDtype,
    CustomFwdDevice,
    ScalerStepWithoutScale,
    ScalerUnused,
    ZeroGrad,
    CpuTensorToDevice,
    SyncInLoop,
    DataParallel,
    DdpNoSync,
    DataLoaderWorkers,
    NonBlocking,
    EvalNoGrad,
    DebugApi,
    CudnnBenchmark,
    ConvBiasBeforeBn,
    TensorCoreSizes,
]
