# envbuild launch ray: h100 on 2 node(s) x 8 GPU(s) (NVIDIA H100), verl 0.9.1, grpo, tcp
# Run these in the image on each node (apptainer exec --nv IMAGE.sif bash, or docker
# run --gpus all --network host --ipc host -it IMAGE bash), or beside a rendered run script.
HEAD_IP=${HEAD_IP:?set HEAD_IP to the address the other nodes reach the head at}
# 1. on every node, before `ray start` (Ray's workers inherit it, and verl hands them nothing of the shell that runs step 4; a value you export wins):
export NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-1}
export HF_ENDPOINT=${HF_ENDPOINT:-https://huggingface.co}
export VLLM_DISABLE_COMPILE_CACHE=${VLLM_DISABLE_COMPILE_CACHE:-0}
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF-expandable_segments:True}
iface=$(awk '$2 == "00000000" {print $1; exit}' /proc/net/route)  # the default route's interface
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-$iface} GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-$iface}
# 2. on the head node:
ray start --head --node-ip-address="$HEAD_IP" --port=6379 --num-gpus=8 --disable-usage-stats
# 3. on each of the other 1 node(s):
ray start --address="$HEAD_IP":6379 --num-gpus=8 --disable-usage-stats
# 4. on the head, in the container of its `ray start` (Ray's sockets are in its /tmp), once `ray status` shows 16 GPUs; the image must be built for this run: envbuild build h100 --algo grpo --gpus-per-node 8 --nodes 2
RAY_ADDRESS="$HEAD_IP:6379" /opt/envbuild/run_ppo_gsm8k.sh
