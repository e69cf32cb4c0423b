# evt build. `make` builds build/libevt.a, build/libevt.so and build/evtc; `make test` runs every test (and, with
# clang's libFuzzer, 30 s of parser fuzzing) and ends with one line "N passed, N failed"; `make test-gpu` runs every GPU check (tests/gpu/run.sh: a machine with
# a Hopper GPU; same last line); `make asan` rebuilds with ASan+UBSan into build-asan/ and runs the C tests.
# Warnings are errors.
CC      ?= gcc
BUILD   ?= build
OPT     ?= -O2
SAN     ?=
CBC_CFLAGS := $(shell pkg-config --cflags cbc 2>/dev/null)
CBC_LIBS   := $(shell pkg-config --libs cbc 2>/dev/null)
# The interpreter's GEMMs and convolutions: OpenBLAS (scripts/setup.sh installs libopenblas-dev).
BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS   := $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
CFLAGS  = -std=c11 $(OPT) -g -fPIC -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wno-missing-field-initializers \
          -Werror=switch -D_GNU_SOURCE -Iinclude -Isrc -Ikernels $(CBC_CFLAGS) $(BLAS_CFLAGS) $(SAN) -MMD -MP
LDLIBS  = $(CBC_LIBS) $(BLAS_LIBS) -lm -lpthread -ldl

LIB_SRC  := $(sort $(shell find src -name '*.c' ! -path 'src/cli/*'))
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
TEST_SRC := $(sort $(wildcard tests/c/*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/obj/%.o)

.PHONY: all test test-gpu asan fuzz clean cuda
NVCC ?= nvcc
# The kernel library's GPU: the present one (nvidia-smi's compute capability), else sm_90
GPU_CC := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
CUDA_ARCH ?= $(if $(GPU_CC),sm_$(GPU_CC),sm_90)
# The kernel library's targets (tests/gpu/run.sh ampere: PTX for compute_80 only, into FALLBACK_SO elsewhere)
CUDA_GENCODE ?= -arch=$(CUDA_ARCH)
FALLBACK_SO ?= $(BUILD)/libevt_fallback.so
CUDA_LIB ?= $(abspath $(dir $(shell command -v $(NVCC) 2>/dev/null))/../lib64)
all: $(BUILD)/libevt.a $(BUILD)/libevt.so $(BUILD)/evtc $(BUILD)/unit_tests
# With nvcc present, `make` also builds the CUDA kernel library, so `evtc run --device auto` can use a GPU.
ifneq ($(shell command -v $(NVCC) 2>/dev/null),)
all: $(FALLBACK_SO)
endif

$(BUILD)/obj/%.o: %.c | $(BUILD)/layering.ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# The layering of docs/architecture.md, checked from the #include lines before anything compiles.
LAYERED := $(shell find src kernels -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' -o -name '*.def')
$(BUILD)/layering.ok: scripts/check_layering.py $(LAYERED)
	@mkdir -p $(BUILD)
	python3 scripts/check_layering.py
	@touch $@

$(BUILD)/libevt.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libevt.so: $(LIB_OBJ)
	$(CC) -shared $(SAN) -o $@ $^ $(LDLIBS)

$(BUILD)/evtc: $(CLI_OBJ) $(BUILD)/libevt.a
	$(CC) $(SAN) -o $@ $(CLI_OBJ) $(BUILD)/libevt.a $(LDLIBS)

$(BUILD)/unit_tests: $(TEST_OBJ) $(BUILD)/libevt.a
	$(CC) $(SAN) -o $@ $(TEST_OBJ) $(BUILD)/libevt.a $(LDLIBS)

# The per-node CUDA kernel library (kernels/fallback/, one file per op family), loaded by src/runtime/gpu/cuda.c with
# dlopen (libevt itself never links CUDA). --fmad=false keeps a*b+c as two roundings, like the CPU interpreter.
cuda: $(FALLBACK_SO)
# kernels/fallback/cudnn_sdpa.cu (attention through cuDNN's flash-attention engines) loads libcudnn with dlopen at
# run time; it only needs cudnn_graph.h to compile: from $(CUDA_HOME)/include, /usr/local/cuda/include or the
# nvidia-cudnn pip wheel (a namespace package: __path__). Without it the module compiles to stubs that say so.
CUDNN_INCLUDE ?= $(firstword $(foreach d,$(if $(CUDA_HOME),$(CUDA_HOME)/include) /usr/local/cuda/include \
  $(shell python3 -c "import nvidia.cudnn,os;print(os.path.join(list(nvidia.cudnn.__path__)[0],'include'))" 2>/dev/null),\
  $(if $(wildcard $(d)/cudnn_graph.h),$(d))))
FALLBACK_SRC := $(sort $(wildcard kernels/fallback/*.cu))
FALLBACK_HDR := kernels/fallback/internal.h kernels/evt_fallback.h kernels/evt_fb_gemm.h kernels/evt_cudnn_sdpa.h \
  kernels/evt_fp8.cuh kernels/philox.h src/ir/ops.def
$(FALLBACK_SO): $(FALLBACK_SRC) $(FALLBACK_HDR)
	@mkdir -p $(dir $@)
	$(NVCC) -O2 --fmad=false $(CUDA_GENCODE) -Xcompiler -fPIC -shared -Ikernels -Isrc \
	  $(if $(CUDNN_INCLUDE),-DEVT_HAVE_CUDNN -I$(CUDNN_INCLUDE)) -o $@ $(FALLBACK_SRC) \
	  -L$(CUDA_LIB) -Xlinker -rpath -Xlinker $(CUDA_LIB) -lcublasLt -lcublas -ldl

test: all
	@bash tests/run.sh $(BUILD)

# Every GPU correctness check (it builds what it needs; exit 2 at once without a GPU). Logs: $OUT or build/gpu-logs.
test-gpu:
	@bash tests/gpu/run.sh

asan:
	$(MAKE) BUILD=build-asan OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" all
	ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 bash tests/run.sh build-asan --c-only

# libFuzzer target for the parser (needs clang): build/fuzz_parse tests/fuzz/corpus. `make test` builds it and runs
# it for 30 s when clang has libFuzzer (tests/run.sh); rebuilt only when a source changed.
FUZZ_DEPS := tests/fuzz/fuzz_parse.c $(LIB_SRC) $(shell find src include kernels -name '*.h' -o -name '*.def')
fuzz: $(BUILD)/fuzz_parse
$(BUILD)/fuzz_parse: $(FUZZ_DEPS)
	@mkdir -p $(BUILD)
	clang -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -D_GNU_SOURCE -Iinclude -Isrc -Ikernels \
	  tests/fuzz/fuzz_parse.c $(LIB_SRC) $(CBC_CFLAGS) $(BLAS_CFLAGS) $(CBC_LIBS) $(BLAS_LIBS) -lm -lpthread -ldl -o $@

clean:
	rm -rf build build-asan

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_OBJ:.o=.d)
