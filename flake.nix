{
  description = "fused-geglu: fused GeGLU MLP and bias-epilogue linear kernels (kernel-builder)";

  # kernel-builder reads build.toml and produces the same build/<variant>/ layout as the
  # Nix-free `fused-geglu build` (for every torch/CUDA variant it supports):
  #   nix run .#build-and-copy      # -> build/
  inputs = {
    kernel-builder.url = "github:huggingface/kernels";
  };

  outputs =
    { self, kernel-builder, ... }:
    kernel-builder.lib.genKernelFlakeOutputs {
      inherit self;
      path = ./.;
    };
}
