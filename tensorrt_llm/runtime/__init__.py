from .kv_cache_manager import (KVCacheConfig, KVCacheFullError, KVCacheManager, allocate_pool,
                               copy_blocks)
from .sampling import SamplingConfig, make_generator, sample
