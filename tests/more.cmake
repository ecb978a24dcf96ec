# Extra test targets, included by tests/CMakeLists.txt.
#
# PyTorch numerics check (tests/torch/): torch_check (C++) builds a tiny GPT,
# LLaMA or ResNet training graph and writes weights, batch, gradients and the
# weights after a few optimizer steps (AdamW; SGD with momentum for ResNet,
# with the batch-norm running statistics) as safetensors;
# tests/torch/check_model.py rebuilds the model in PyTorch (Debian
# python3-torch, run by /usr/bin/python3) and compares every tensor. Run them
# with:  ctest -L torch --output-on-failure
add_executable(torch_check torch_check.cc)
target_link_libraries(torch_check PRIVATE meshflow)

foreach(model gpt gpt_untied llama llama_tied resnet_basic resnet_bottleneck)
  add_test(NAME torch_${model}
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/torch/run_check.sh $<TARGET_FILE:torch_check> ${model})
  set_tests_properties(torch_${model} PROPERTIES
    LABELS torch TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=2")
endforeach()
# Hugging Face interop (tests/torch/hf_check.py): transformers-style GPT-2 and
# LLaMA weights read by meshflow (same loss) and written back (same tensors).
foreach(model gpt2 llama)
  add_test(NAME torch_hf_${model}
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/torch/run_hf_check.sh $<TARGET_FILE:torch_check> ${model})
  set_tests_properties(torch_hf_${model} PROPERTIES
    LABELS torch TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=2")
endforeach()
