"""The backend `auto` serves: candidates timed and checked against torch float32 on the engine's
own inputs and pooling, the choice cached beside the model's ONNX export."""
