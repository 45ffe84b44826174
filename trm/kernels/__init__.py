"""The Triton kernels the model calls in place of torch's ops: MLP-t's token-mixing sublayer (fused_mix, and its
Triton backward in fused_mix_backward) and the channel SwiGLU's GEMMs (fused_swiglu launches swiglu_gemms' kernels).

Below the model: these modules import nothing else of trm (an import contract in pyproject.toml). Which of them a run
uses is trm/kernel_choice.py's, above the model (it tries them on a built block).
"""
