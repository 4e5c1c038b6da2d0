# Triton with what the sample models' Python-backend code imports (onnxruntime).
# On a GPU host the same image serves GPU models (ONNX Runtime / TensorRT backends).
FROM nvcr.io/nvidia/tritonserver:24.08-py3
RUN pip install --no-cache-dir "onnxruntime>=1.17" "numpy<2"
