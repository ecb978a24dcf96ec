# meshflow: the two commands of the README.
#   make demo   installs dependencies (Debian packages), builds, trains a model end to end
#   make test   installs dependencies, builds, runs the whole test suite
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

.PHONY: all deps build demo test bench format clean

all: build

deps:
	bash scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j$(JOBS)

demo: build
	./$(BUILD)/meshflow train configs/fashion_mlp.json --metrics $(BUILD)/demo_metrics.jsonl

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 900

bench: build
	bash bench/gpt_vs_torch.sh

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf $(BUILD)
