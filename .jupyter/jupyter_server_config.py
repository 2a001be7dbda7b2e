# The repository's Jupyter server settings; `make lab` puts this folder first on JUPYTER_CONFIG_PATH
# (elsewhere: JUPYTER_CONFIG_PATH=.jupyter jupyter lab). Every notebook JupyterLab saves is written in
# its committed form (kvcost.nbclean: no interpreter version, timings or papermill metadata), so opening,
# running and saving a notebook with its default parameters leaves `git status` clean.
c = get_config()  # noqa: F821  (the config object Jupyter passes in)
c.ContentsManager.pre_save_hook = "kvcost.nbclean.pre_save_hook"
