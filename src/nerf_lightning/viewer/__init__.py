"""The browser viewer (viser): a field rendered from the browser's camera, progressively and within a time
budget, with the capture's cameras, scene box and occupancy grid, a camera-path editor, and the training
controls when it runs inside ``train`` (``viewer=on``).

- ``server.py``: the viser server, its browsers and the render loop;
- ``progressive.py``: images rendered a chunk of rays at a time;
- ``scene.py`` / ``panels.py``: what the page shows besides the rendered field (``status.py``: the
  training panel's numbers);
- ``cameras.py`` / ``camera_path.py``: browser cameras and keyframes -> nerfstudio ``camera_path.json``;
- ``callback.py``: the training callback; ``client.py``: a browser stand-in speaking viser's protocol;
- ``ports.py``: a taken port is an error naming a free one; ``options.py``: what the viewer's keys hold.

Nothing here is imported unless the viewer is used (``viewer=off`` imports no viser).
"""
