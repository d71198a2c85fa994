#include "entry.h"

#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>

namespace py = pybind11;

namespace tensorrt_llm {

Arg tensor(char const* name) { return Arg(name, Arg::Kind::kTensor); }
Arg optionalTensor(char const* name) { return Arg(name, Arg::Kind::kTensor, true); }
Arg real(char const* name) { return Arg(name, Arg::Kind::kReal); }
Arg integer(char const* name) { return Arg(name, Arg::Kind::kInteger); }
Arg flag(char const* name) { return Arg(name, Arg::Kind::kFlag); }
Arg text(char const* name) { return Arg(name, Arg::Kind::kText); }
Arg stream() { return Arg("stream", Arg::Kind::kStream); }

// ---- Call ----

template <typename Map>
static auto const& lookup(Map const& map, std::string const& name, char const* what) {
    auto it = map.find(name);
    if (it == map.end()) throw std::logic_error("binding entry asked for " + std::string(what) + " " + name);
    return it->second;
}

TensorArg const& Call::operator[](std::string const& name) const { return lookup(tensors_, name, "tensor"); }
bool Call::has(std::string const& name) const { return tensors_.count(name) != 0; }
void const* Call::ptr(std::string const& name) const { return has(name) ? (*this)[name].data() : nullptr; }
double Call::real(std::string const& name) const { return lookup(reals_, name, "real"); }
int64_t Call::integer(std::string const& name) const { return lookup(integers_, name, "integer"); }
bool Call::flag(std::string const& name) const { return lookup(flags_, name, "flag"); }
std::string const& Call::text(std::string const& name) const { return lookup(texts_, name, "text"); }

void Call::shape(std::string const& name, std::vector<int64_t> const& expected) const {
    if (has(name)) checkShape((*this)[name], expected);
}

void Call::together(std::string const& a, std::string const& b) const {
    if (has(a) != has(b)) throw std::invalid_argument(a + " and " + b + " must be given together");
}

void Call::fitsInt(char const* what, int64_t value) const {
    if (value > std::numeric_limits<int32_t>::max()) {
        throw std::invalid_argument(std::string(what) + " = " + std::to_string(value) + " is too large");
    }
}

void Call::finiteNonNegative(std::string const& name) const {
    double const v = real(name);
    if (!(v >= 0.0) || !std::isfinite(v)) {
        throw std::invalid_argument(name + " must be finite and >= 0, got " + std::to_string(v));
    }
}

void Call::packed16(std::string const& name) const {
    if (!has(name)) return;
    TensorArg const& t = (*this)[name];
    int64_t const perPack = 16 / dtypeSize(t.dtype);
    bool ok = t.ptr % 16 == 0;
    for (int d = 0; d + 1 < t.dim(); ++d) ok = ok && t.stride(d) % perPack == 0;
    if (!ok) {
        throw std::invalid_argument(t.describe()
                                    + " must start on a 16-byte boundary with row strides of whole 16-byte packs");
    }
}

// ---- the mechanism ----

class Binder {
public:
    // Step 1: the Python call's arguments bound to the entry's, parsed.
    static Call bind(Entry const& e, py::args const& args, py::kwargs const& kwargs) {
        if (args.size() > e.args.size()) {
            throw py::type_error("takes " + std::to_string(e.args.size()) + " arguments, got "
                                 + std::to_string(args.size()));
        }
        for (auto const& item : kwargs) {
            std::string const key = py::str(item.first);
            bool known = false;
            for (size_t i = 0; i < e.args.size(); ++i) {
                if (e.args[i].name_ == key) {
                    if (i < args.size()) throw py::type_error("got " + key + " twice");
                    known = true;
                }
            }
            if (!known) throw py::type_error("got an unexpected argument " + key);
        }
        Call c;
        for (size_t i = 0; i < e.args.size(); ++i) {
            Arg const& a = e.args[i];
            py::object value;
            if (i < args.size()) {
                value = args[i];
            } else if (kwargs.contains(a.name_.c_str())) {
                value = kwargs[a.name_.c_str()];
            } else if (a.optional_) {
                continue;
            } else {
                throw py::type_error("missing argument " + a.name_);
            }
            parse(a, value, c);
        }
        return c;
    }

    // Step 2: each tensor's rank and dtype, then its dtype and shape against another's.
    static void checkTensors(Entry const& e, Call const& c) {
        for (Arg const& a : e.args) {
            if (a.kind_ != Arg::Kind::kTensor || !c.has(a.name_)) continue;
            TensorArg const& t = c[a.name_];
            if (a.rank_ >= 0) checkDim(t, a.rank_);
            if (!a.dtypes_.empty()) checkDtype(t, a.dtypes_);
        }
        for (Arg const& a : e.args) {
            if (a.kind_ != Arg::Kind::kTensor || !c.has(a.name_)) continue;
            TensorArg const& t = c[a.name_];
            if (!a.dtypeOf_.empty() && c.has(a.dtypeOf_)) checkSameDtype(c[a.dtypeOf_], t);
            if (!a.shapeOf_.empty() && c.has(a.shapeOf_)) checkSameShape(c[a.shapeOf_], t);
        }
    }

    // Step 4: layouts.
    static void checkLayouts(Entry const& e, Call const& c) {
        for (Arg const& a : e.args) {
            if (a.kind_ != Arg::Kind::kTensor || !c.has(a.name_)) continue;
            TensorArg const& t = c[a.name_];
            if (a.layout_ == Arg::Layout::kLastDimContiguous) checkLastDimContiguous(t);
            if (a.layout_ == Arg::Layout::kContiguous) checkContiguous(t);
            if (a.written_) checkNonOverlapping(t);
        }
    }

    // "rms_norm(out, x, weight, eps, stream, residual=None, residual_out=None)"
    static std::string signature(Entry const& e) {
        std::string s = std::string(e.name) + "(";
        for (size_t i = 0; i < e.args.size(); ++i) {
            Arg const& a = e.args[i];
            s += (i ? ", " : "") + a.name_ + (a.optional_ ? "=None" : "");
        }
        return s + ")";
    }

    static std::vector<TensorArg const*> tensors(Entry const& e, Call const& c) {
        std::vector<TensorArg const*> all;
        for (Arg const& a : e.args) {
            if (a.kind_ == Arg::Kind::kTensor && c.has(a.name_)) all.push_back(&c[a.name_]);
        }
        return all;
    }

private:
    static void parse(Arg const& a, py::object const& value, Call& c) {
        std::string const& name = a.name_;
        try {
            switch (a.kind_) {
                case Arg::Kind::kTensor:
                    if (value.is_none() && a.optional_) return;
                    c.tensors_.emplace(name, toTensorArg(value, name.c_str()));
                    c.tensors_[name].pinnedHost = a.pinnedHost_;
                    return;
                case Arg::Kind::kReal: c.reals_[name] = value.cast<double>(); return;
                case Arg::Kind::kInteger: c.integers_[name] = value.cast<int64_t>(); return;
                case Arg::Kind::kFlag: c.flags_[name] = value.cast<bool>(); return;
                case Arg::Kind::kText: c.texts_[name] = value.cast<std::string>(); return;
                case Arg::Kind::kStream: c.stream_ = value.cast<uintptr_t>(); return;
            }
        } catch (py::cast_error const&) {
            static char const* const kinds[] = {"a tensor", "a number", "an int", "a bool", "a str", "a stream handle"};
            throw py::type_error(name + " must be " + kinds[static_cast<int>(a.kind_)] + ", got "
                                 + std::string(py::str(py::type::of(value).attr("__name__"))));
        }
    }
};

// Runs fn, starting the messages of its errors with the entry's name ("rms_norm: ...").
template <typename Fn>
static void withName(char const* name, Fn&& fn) {
    auto prefixed = [name](char const* what) {
        std::string msg = what;
        std::string const prefix = std::string(name) + ": ";
        return msg.rfind(prefix, 0) == 0 ? msg : prefix + msg;
    };
    try {
        fn();
    } catch (py::type_error const& e) {
        throw py::type_error(prefixed(e.what()));
    } catch (std::invalid_argument const& e) {
        throw std::invalid_argument(prefixed(e.what()));
    } catch (std::runtime_error const& e) {
        throw std::runtime_error(prefixed(e.what()));
    }
}

// Steps 1-4.
static Call bound(Entry const& e, py::args const& args, py::kwargs const& kwargs) {
    Call c = Binder::bind(e, args, kwargs);
    Binder::checkTensors(e, c);
    if (e.check) e.check(c);
    Binder::checkLayouts(e, c);
    return c;
}

// Step 5 of a host entry.
static void checkHostMemory(Entry const& e, Call const& c) {
    for (TensorArg const* t : Binder::tensors(e, c)) {
        if (t->device >= 0) throw std::invalid_argument(t->describe() + " must be a host (CPU) tensor");
    }
}

static void run(Entry const& e, py::args const& args, py::kwargs const& kwargs) {
    withName(e.name, [&] {
        Call c = bound(e, args, kwargs);
        if (e.host) {
            checkHostMemory(e, c);
            py::gil_scoped_release release;
            e.launch(c);
            return;
        }
        std::vector<TensorArg const*> all = Binder::tensors(e, c);
        int const device = checkSameCudaDevice(e.name, all);
        DeviceScope scope(device, all, reinterpret_cast<uintptr_t>(c.stream()));
        py::gil_scoped_release release;
        e.launch(c);
    });
}

// Every defined entry by name, for prepare_host_calls.
static std::map<std::string, std::shared_ptr<Entry const>>& registry() {
    static std::map<std::string, std::shared_ptr<Entry const>> entries;
    return entries;
}

void define(py::module_& m, Entry entry) {
    std::string const doc = Binder::signature(entry) + "\n\n" + entry.doc;
    auto shared = std::make_shared<Entry const>(std::move(entry));
    registry()[shared->name] = shared;
    m.def(shared->name, [shared](py::args args, py::kwargs kwargs) { run(*shared, args, kwargs); }, doc.c_str());
}

namespace {

// Prepared host calls: each entry with its bound, checked arguments. The tensors' memory is the
// caller's to keep alive while the object may run; what a kernel reads from them (lengths, block
// ids) it checks itself at every run, as it does for any call.
class HostCalls {
public:
    void add(std::shared_ptr<Entry const> e, Call c) { calls_.emplace_back(std::move(e), std::move(c)); }
    size_t size() const { return calls_.size(); }
    void run() const {
        py::gil_scoped_release release;
        for (auto const& [e, c] : calls_) withName(e->name, [&] { e->launch(c); });
    }

private:
    std::vector<std::pair<std::shared_ptr<Entry const>, Call>> calls_;
};

} // namespace

void defineHostCalls(py::module_& m) {
    py::class_<HostCalls>(m, "HostCalls", "Host entries' calls, bound and checked once (prepare_host_calls).")
        .def("__call__", &HostCalls::run, "Runs the calls in order.")
        .def("__len__", &HostCalls::size);
    m.def(
        "prepare_host_calls",
        [](py::iterable calls) {
            HostCalls prepared;
            for (py::handle item : calls) {
                auto const call = item.cast<py::tuple>();
                if (call.size() != 3) throw py::type_error("prepare_host_calls: each call is (name, args, kwargs)");
                std::string const name = call[0].cast<std::string>();
                auto const found = registry().find(name);
                if (found == registry().end() || !found->second->host) {
                    throw py::type_error("prepare_host_calls: " + name + " is not a host entry");
                }
                Entry const& e = *found->second;
                withName(e.name, [&] {
                    Call c = bound(e, py::reinterpret_borrow<py::args>(call[1].cast<py::tuple>()),
                                   py::reinterpret_borrow<py::kwargs>(call[2].cast<py::dict>()));
                    checkHostMemory(e, c);
                    prepared.add(found->second, std::move(c));
                });
            }
            return prepared;
        },
        py::arg("calls"),
        "HostCalls for calls [(entry name, args tuple, kwargs dict), ...] of host entries: each bound and "
        "checked now as the entry's own call would be, and run, in order, by calling the result.");
    py::list names;
    for (auto const& [name, e] : registry()) {
        if (e->host) names.append(name);
    }
    m.attr("HOST_ENTRIES") = py::frozenset(names);
}

} // namespace tensorrt_llm
