"""The engines that build and run images: docker.py (BuildKit through the docker client and
daemon), daemonless.py (podman or buildah, and the choice among them), bake.py
(docker-bake.hcl), launch.py (Slurm, KubeRay and plain Ray launchers)."""
