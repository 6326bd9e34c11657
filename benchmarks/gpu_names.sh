# Names the GPU scripts share with the tuner, sourced by gpu_study.sh, gpu_background.sh and gpu_head_bundle.sh
# (shell cannot import them; tests/test_eagle3_head.py checks them against tuner.models.demo).
HEAD_NAME=SmolLM2-135M-Instruct-eagle3   # tuner.models.demo.EAGLE3_NAME: the demo head's folder in the model cache
