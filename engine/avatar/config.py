from typing import Literal

from pydantic import BaseModel, Field

KernelMode = Literal["auto", "on", "off"]


class AvatarConfig(BaseModel):
    """The idol on screen: character, frame backend, output profile, lip-sync timing."""

    enabled: bool = True
    character: str = Field("builtin:default", description="'builtin:default', a rig folder or a .psd")
    backend: Literal["auto", "torch", "cuda-graph", "onnxruntime", "tensorrt"] = "auto"
    profile: Literal["auto", "720p", "1080p", "portrait", "square", "360p"] = Field(
        "auto",
        description="output size; 'auto' = 720p with a CUDA GPU or 8+ cores; on a smaller CPU machine the "
        "engine measures one 720p stream at start and takes 720p if it costs at most a quarter of the cores "
        "(the 2-core development machine: yes), else 360p",
    )
    cpu_kernels: KernelMode = Field(
        "auto",
        description="the CPU renderer's face features compiled with torch.compile (a C++ compiler needed; ~45 s "
        "the first start on a machine, cached under var/cache/inductor): an eye 0.15 ms instead of 0.9 at 720p. "
        "'auto': compiled where it works, else eager; 'on': compiled or the engine fails to load; 'off': eager",
    )
    articulation_lead_ms: float = Field(20.0, ge=-100, le=200, description="lips lead the sound by this")
    packed_alpha: bool = Field(
        False,
        description="the session's own picture is colour|alpha side by side (the OBS page gets that on its own "
        "WHEP tap without this; needed for ?own=1 and for other players that recombine it)",
    )
    background: str = Field("#00000000", description="RGBA hex background when not packing alpha")
    catch_up_ms: float = Field(
        67.0,
        ge=0,
        le=500,
        description="a frame asked for up to this late (a stalled encode or event loop) is still sent at its own "
        "timestamp and the next ones follow at once, which the viewer's jitter buffer hides; later than this "
        "the late frames are dropped (never less than one frame period: 33 ms, the behaviour before)",
    )
    render_gather_ms: float = Field(
        8.0,
        ge=0,
        le=20,
        description="the sessions of an engine render their frames together: every session's frames fall on one "
        "30 fps grid, and the render waits up to this long for each session's request of the next frame, so a "
        "GPU makes one batched round trip a frame period for all of them instead of one each (frames are "
        "rendered a frame ahead, so the wait is not seen); 0 = only requests made in the same loop tick",
    )
    finish_threads: int = Field(
        0,
        ge=0,
        le=32,
        description="threads that finish a batch's frames side by side (each session's conversion to the sent "
        "picture, after the batch's render): for engines of several sessions on many cores, where the render "
        "thread finishing them one after another is the batch's longest part; 0 = the render thread itself",
    )
