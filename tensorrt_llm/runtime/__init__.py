from .executor import Executor
from .generation import GenerationSession
from .kv_cache_manager import KVCacheConfig, KVCacheFullError, KVCacheManager, allocate_pool, copy_blocks
from .model_runner import ModelRunner
from .request import Request
from .sampling import SamplingConfig, make_generator, sample
from .session import Session

__all__ = ["KVCacheConfig", "KVCacheFullError", "KVCacheManager", "allocate_pool", "copy_blocks", "SamplingConfig",
           "make_generator", "sample", "Executor", "Request", "GenerationSession", "ModelRunner", "Session"]
