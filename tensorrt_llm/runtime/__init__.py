from .kv_cache_manager import (KVCacheConfig, KVCacheFullError, KVCacheManager, allocate_pool,
                               copy_blocks)
from .sampling import SamplingConfig, make_generator, sample
from .generation import GenerationSession
from .model_runner import ModelRunner
from .session import Session

__all__ = ["KVCacheConfig", "KVCacheFullError", "KVCacheManager", "allocate_pool", "copy_blocks", "SamplingConfig",
           "make_generator", "sample", "GenerationSession", "ModelRunner", "Session"]
