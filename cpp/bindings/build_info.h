// Build facts, compiled into build_info.cpp alone so that a new git commit recompiles one tiny
// file, not the bindings.
#pragma once

namespace tensorrt_llm {

struct BuildInfo {
    char const* version;
    char const* gitCommit;
    char const* buildType;
    char const* cxxCompiler;
    char const* cudaVersion;        // "" for a CPU-only build
    char const* cudaArchitectures;  // "sm_80;sm_90", "" for a CPU-only build
    char const* pybind11Version;
};

BuildInfo const& buildInfo();

} // namespace tensorrt_llm
